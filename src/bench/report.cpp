#include "bench/report.h"

#include "bench/markdown.h"
#include "bench/plots.h"

namespace tandem::bench {

void save_measurements(const std::string& dir, const Results& results) {
  write_text_file(dir + "/results.json", to_json(results).dump(1) + "\n");
}

Written write_report(const std::string& dir, const Results& results) {
  Written w;
  w.analysis = analyze(results);
  auto doc = to_json(results);
  doc["derived"] = to_json(w.analysis);
  write_text_file(dir + "/results.json", doc.dump(1) + "\n");
  w.files.push_back(dir + "/results.json");
  w.markdown = render_markdown(results, w.analysis);
  write_text_file(dir + "/results.md", w.markdown);
  w.files.push_back(dir + "/results.md");
  auto plots = draw_plots(dir, results, w.analysis);
  for (auto& f : plots.files) w.files.push_back(f.rfind('/', 0) == 0 ? f : dir + "/" + f);
  w.plot_note = plots.note;
  return w;
}

}  // namespace tandem::bench
