// `tandem report DIR` re-renders a bench folder from its results.json (a comparison's, or a memory
// frontier's); `tandem report A B` compares two comparison runs (docs/benchmarks.md).
#include <cstdio>
#include <memory>

#include "bench/frontier.h"
#include "bench/markdown.h"
#include "bench/report.h"
#include "cli/commands.h"

namespace tandem::cli {

Command add_report_command(CLI::App& app) {
  auto* sub = app.add_subcommand("report", "Re-render a tandem bench folder, or compare two");
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  sub->add_option("dirs", *dirs, "DIR (re-render) or A B (compare B against A)")->required()->expected(1, 2);
  sub->add_option("--out", *out, "Also write the comparison (A B) to this file");
  return [dirs, out]() -> int {
    if (dirs->size() == 1) {
      const auto& dir = dirs->front();
      if (auto frontier = bench::rerender_frontier(dir)) {  // a `tandem bench --memory-budget` folder
        std::fputs(frontier->c_str(), stdout);
        std::fprintf(stderr, "tandem report: wrote %s/results.md\n", dir.c_str());
        return 0;
      }
      auto written = bench::write_report(dir, bench::load_results(dir));
      std::fputs(written.markdown.c_str(), stdout);
      std::fprintf(stderr, "tandem report: wrote");
      for (const auto& f : written.files) std::fprintf(stderr, " %s", f.c_str());
      std::fprintf(stderr, "\n");
      if (!written.plot_note.empty()) std::fprintf(stderr, "tandem report: plots: %s\n", written.plot_note.c_str());
      return 0;
    }
    const auto a = bench::load_results((*dirs)[0]);
    const auto b = bench::load_results((*dirs)[1]);
    const auto text = bench::render_comparison((*dirs)[0], a, bench::analyze(a), (*dirs)[1], b, bench::analyze(b));
    std::fputs(text.c_str(), stdout);
    if (!out->empty()) bench::write_text_file(*out, text);
    return 0;
  };
}

}  // namespace tandem::cli
