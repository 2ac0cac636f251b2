#include "bench/plots.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "bench/subprocess.h"
#include "tandem/error.h"

namespace tandem::bench {

// Note [Plots]
// Three PNGs beside the report, one panel per model (the configuration's order), drawn by
// gnuplot (pngcairo, noenhanced: names such as dp_replicate stay literal):
// - throughput.png: samples/s (median over the repeats, error bars min..max) against the number
//   of devices, one line per (implementation, strategy). Every line starts at its implementation's
//   single-device run (world 1), the common baseline, so the slope reads as scaling. Tandem's
//   lines are solid, the PyTorch peers' dashed, one colour per strategy (Okabe-Ito, colour-blind
//   safe), the peer of a strategy sharing its colour where it has one.
// - memory.png: peak memory per device (MiB) at the widest world measured, clustered bars of
//   device 0 and the largest of the other devices, so DataParallel's primary replica stands out;
//   each implementation's single-device run comes first, for reference. Rows without a memory
//   figure are left out.
// - breakdown.png: Tandem's step time at the widest world, stacked: compute (the single-device
//   step), exposed communication (0 where the strategy has none), and the rest. The rest can be
//   negative (a wider world's step faster than one device's: noise, or less contention); it is
//   drawn at 0 and the plot says so, and the data file keeps the measured value.
// The inputs are kept under DIR/plots/ (one .dat and one .gp per plot; the .dat files are blocks
// separated by two blank lines, which the scripts select with `index`), so that a reader can
// restyle a plot with `gnuplot DIR/plots/NAME.gp`. Plotting never fails the benchmark: a missing
// gnuplot or a gnuplot error becomes PlotOutcome::note.

namespace {

constexpr const char* kFont = "sans,11";
constexpr const char* kTitleFont = "sans,13";

using Plot = GnuplotPlot;

std::string num(double v) {
  if (!std::isfinite(v)) return "NaN";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// A gnuplot single-quoted string: no escapes but '' for a quote, so any path survives.
std::string gp_path(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += '\'';
    out += c;
  }
  return out + "'";
}

// A gnuplot double-quoted string for titles: "\n" becomes a line break.
std::string gp_text(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string join_path(const std::string& dir, const std::string& rel) {
  if (dir.empty()) return rel;
  if (dir.back() == '/') return dir + rel;
  return dir + "/" + rel;
}

std::string impl_label(const std::string& impl) {
  if (impl == "tandem") return "Tandem";
  if (impl == "pytorch") return "PyTorch";
  return impl;
}

constexpr const char* kMpiSuffix = "(mpi)";  // an MPI row's series: "ddp(mpi)" (build_plots)

// The strategy table's colour for a series; a PyTorch peer shares its Tandem counterpart's, an
// MPI series has its own. A series the table gives none gets a spare one.
std::string colour_of(const std::string& series) {
  const size_t suffix = series.size() >= std::strlen(kMpiSuffix) ? series.size() - std::strlen(kMpiSuffix) : 0;
  const bool mpi = suffix > 0 && series.compare(suffix, std::string::npos, kMpiSuffix) == 0;
  if (const Strategy* s = find_strategy(mpi ? series.substr(0, suffix) : series)) {
    const std::string& colour = mpi ? s->colour_mpi : s->colour;
    if (!colour.empty()) return colour;
  }
  static const std::vector<std::string> spare{"#56B4E9", "#000000", "#F0E442", "#882255"};
  size_t h = std::hash<std::string>{}(series);
  return spare[h % spare.size()];
}

std::string plural(int n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string params_short(int64_t params) {
  char buf[32];
  if (params >= 1000000000) {
    std::snprintf(buf, sizeof buf, "%.3gB", params / 1e9);
  } else if (params >= 1000000) {
    std::snprintf(buf, sizeof buf, "%.3gM", params / 1e6);
  } else if (params >= 1000) {
    std::snprintf(buf, sizeof buf, "%.3gk", params / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(params));
  }
  return buf;
}

// "CPU, Gloo, 1 thread per rank, 2 cores" / "CUDA, NCCL, 8 GPUs".
std::string setup_text(const Results& results) {
  const auto& c = results.config;
  std::string out;
  if (c.device == "cpu") {
    out = "CPU, Gloo, " + plural(c.threads, "thread", "threads") + " per rank";
    const auto it = results.machine.find("cores");
    if (it != results.machine.end() && it->is_number_integer() && it->get<int64_t>() > 0) {
      out += ", " + plural(static_cast<int>(it->get<int64_t>()), "core", "cores");
    }
  } else if (c.device == "cuda") {
    out = "CUDA, NCCL";
    const auto it = results.machine.find("gpus");
    if (it != results.machine.end() && it->is_number_integer() && it->get<int64_t>() > 0) {
      out += ", " + plural(static_cast<int>(it->get<int64_t>()), "GPU", "GPUs");
    }
  } else {
    out = c.device;
  }
  if (!c.precision.empty() && c.precision != "fp32") out += ", " + c.precision;
  return out;
}

std::string repeats_text(const Results& results) {
  return "median over " + plural(results.config.repeats, "repeat", "repeats");
}

// The models to draw: the configuration's order, then any the rows name that it does not.
std::vector<std::string> models_of(const Results& results, const std::vector<Row>& rows) {
  std::vector<std::string> models = results.config.models;
  for (const auto& r : rows) {
    if (std::find(models.begin(), models.end(), r.model) == models.end()) models.push_back(r.model);
  }
  return models;
}

// The common preamble: terminal, output, and a multiplot grid of `panels` panels.
std::string preamble(const std::string& what, const std::string& png, int panels, const std::string& title) {
  const int cols = std::min(panels, 3);
  const int grid_rows = (panels + cols - 1) / cols;
  const int lines = static_cast<int>(std::count(title.begin(), title.end(), '\n')) + 1;
  std::ostringstream s;
  s << "# " << what << " (written by tandem bench; run: gnuplot THIS_FILE)\n"
    << "set encoding utf8\n"
    << "set terminal pngcairo noenhanced size " << std::max(40 + 520 * cols, 1000) << "," << 30 + 22 * lines + 460 * grid_rows
    << " font " << gp_text(kFont) << "\n"
    << "set output " << gp_path(png) << "\n"
    << "set datafile missing 'NaN'\n"
    << "set multiplot layout " << grid_rows << "," << cols << " title " << gp_text(title) << " font "
    << gp_text(kTitleFont) << "\n";
  return s.str();
}

// Several quantities' titles for one panel share this.
std::string panel_title(const std::string& model, const std::vector<const Row*>& rows, const std::string& extra) {
  std::string t = model;
  for (const Row* r : rows) {
    if (r->params > 0) {
      t += " (" + params_short(r->params) + " parameters, batch " + std::to_string(r->batch_per_device) +
           " per device)";
      break;
    }
  }
  if (!extra.empty()) t += "\n" + extra;
  return t;
}

// --- throughput.png --------------------------------------------------------------------------

Plot throughput_plot(const std::string& dir, const Results& results, const std::vector<Row>& rows) {
  const std::string& single_name = baseline().name;
  Plot p;
  p.name = "throughput";
  const std::string dat = join_path(dir, "plots/throughput.dat");
  std::ostringstream data, panels;
  data << "# throughput against world size per strategy and model (tandem bench)\n"
       << "# one block per (model, impl, strategy); each line starts at the implementation's single-device run\n";
  int index = 0, drawn = 0;
  for (const auto& model : models_of(results, rows)) {
    std::vector<const Row*> mine;
    for (const auto& r : rows) {
      if (r.model == model && !r.samples_per_s.empty()) mine.push_back(&r);
    }
    if (mine.empty()) continue;
    // The series, in the table's order: every non-single strategy, and an implementation's
    // single run alone when it has nothing else.
    std::vector<std::pair<std::string, std::string>> series;
    for (const Row* r : mine) {
      std::pair<std::string, std::string> key{r->impl, r->strategy};
      if (r->strategy != single_name && std::find(series.begin(), series.end(), key) == series.end()) {
        series.push_back(key);
      }
    }
    for (const Row* r : mine) {
      if (r->strategy != single_name) continue;
      const bool has_other = std::any_of(series.begin(), series.end(), [&](const auto& s) { return s.first == r->impl; });
      std::pair<std::string, std::string> key{r->impl, r->strategy};
      if (!has_other && std::find(series.begin(), series.end(), key) == series.end()) series.push_back(key);
    }
    std::set<int> worlds;
    std::vector<std::string> plots;
    for (const auto& [impl, strategy] : series) {
      std::vector<const Row*> points;
      const Row* single = nullptr;
      for (const Row* r : mine) {
        if (r->impl == impl && r->strategy == single_name && r->world == 1) single = r;
      }
      for (const Row* r : mine) {
        if (r->impl == impl && r->strategy == strategy) points.push_back(r);
      }
      std::sort(points.begin(), points.end(), [](const Row* a, const Row* b) { return a->world < b->world; });
      const bool from_single = single && strategy != single_name && points.front()->world > 1;
      if (from_single) points.insert(points.begin(), single);
      data << "# model=" << model << " impl=" << impl << " strategy=" << strategy
           << (from_single ? " (world 1: the single-device run)" : "") << "\n"
           << "# devices samples_per_s_median samples_per_s_min samples_per_s_max\n";
      for (const Row* r : points) {
        worlds.insert(r->world);
        data << r->world << " " << num(r->samples_per_s.median) << " " << num(r->samples_per_s.min) << " "
             << num(r->samples_per_s.max) << "\n";
      }
      data << "\n\n";
      const bool peer = impl != "tandem";
      std::ostringstream pl;
      pl << gp_path(dat) << " index " << index++ << " using 1:2:3:4 with yerrorlines lw 2 pt " << (peer ? 6 : 7)
         << " ps 1.2 dt " << (peer ? 2 : 1) << " lc rgb " << gp_text(colour_of(strategy)) << " title "
         << gp_text(impl_label(impl) + " " + strategy);
      plots.push_back(pl.str());
    }
    const int lo = *worlds.begin(), hi = *worlds.rbegin();
    panels << "\n# panel: " << model << "\n"
           << "set title " << gp_text(panel_title(model, mine, "")) << "\n";
    if (hi >= 4) {
      panels << "set logscale x 2\nset xrange [" << num(lo / 1.3) << ":" << num(hi * 1.3) << "]\n";
    } else {
      panels << "unset logscale x\nset xrange [" << num(lo - 0.25) << ":" << num(hi + 0.25) << "]\n";
    }
    panels << "set xtics (";
    bool first = true;
    for (int w : worlds) {
      panels << (first ? "" : ", ") << w;
      first = false;
    }
    panels << ")\nplot ";
    for (size_t i = 0; i < plots.size(); ++i) panels << (i ? ", \\\n     " : "") << plots[i];
    panels << "\n";
    ++drawn;
  }
  if (drawn == 0) {
    p.skipped = "no throughput measured";
    return p;
  }
  const std::string title = "Throughput against world size — " + setup_text(results) + "\nsamples/s of the whole job, " +
                            repeats_text(results) + " (bars: min..max); Tandem solid, PyTorch dashed" +
                            "\nevery line starts at its implementation's single-device run";
  std::ostringstream s;
  s << preamble("throughput against world size per strategy and model", join_path(dir, "throughput.png"), drawn,
                title)
    << "set xlabel 'devices (world size)'\n"
    << "set ylabel 'samples/s (whole job)'\n"
    << "set yrange [0:*]\n"
    << "set grid ytics lc rgb '#dddddd'\n"
    << "set key outside top center horizontal maxrows 3 samplen 3 font 'sans,10'\n"
    << "set bars small\n"
    << panels.str() << "unset multiplot\n";
  p.script = s.str();
  p.data = data.str();
  return p;
}

// --- memory.png ------------------------------------------------------------------------------

std::string memory_kind_text(const std::string& kind) {
  if (kind == "rss") return "whole-process RSS per rank, LibTorch included";
  if (kind == "replica") return "DataParallel's per-replica accounting of model bytes";
  if (kind == "cuda") return "CUDA peak allocation";
  return kind;
}

Plot memory_plot(const std::string& dir, const Results& results, const std::vector<Row>& rows) {
  Plot p;
  p.name = "memory";
  const std::string dat = join_path(dir, "plots/memory.dat");
  std::ostringstream data, panels;
  data << "# peak memory per device (MiB) at the widest world, per model (tandem bench)\n"
       << "# one block per model; each implementation's single-device run first, for reference\n";
  std::vector<std::string> kinds;
  int index = 0;
  for (const auto& model : models_of(results, rows)) {
    std::vector<const Row*> measured;
    int widest = 0;
    for (const auto& r : rows) {
      if (r.model != model || r.mem_primary_MB.empty()) continue;
      measured.push_back(&r);
      widest = std::max(widest, r.world);
    }
    if (measured.empty()) continue;
    std::vector<const Row*> shown;
    for (const Row* r : measured) {
      if (r->world == widest || (r->strategy == baseline().name && r->world == 1)) shown.push_back(r);
    }
    data << "# model=" << model << " widest_world=" << widest << "\n"
         << "# impl strategy devices device0_median device0_min device0_max others_max_median others_max_min "
            "others_max_max\n";
    for (const Row* r : shown) {
      if (!r->mem_kind.empty() && std::find(kinds.begin(), kinds.end(), r->mem_kind) == kinds.end()) {
        kinds.push_back(r->mem_kind);
      }
      // '*': DataParallel's accounting (model bytes only) beside whole-process RSS (LibTorch too).
      data << r->impl << " " << r->strategy << (r->mem_kind == "replica" ? "*" : "") << " " << r->world << " "
           << num(r->mem_primary_MB.median) << " "
           << num(r->mem_primary_MB.min) << " " << num(r->mem_primary_MB.max) << " " << num(r->mem_others_MB.median)
           << " " << num(r->mem_others_MB.min) << " " << num(r->mem_others_MB.max) << "\n";
    }
    data << "\n\n";
    const bool with_single = std::any_of(shown.begin(), shown.end(), [](const Row* r) { return r->world == 1; });
    const std::string where = widest == 1 ? "1 device"
                                          : "widest world: " + plural(widest, "device", "devices") +
                                                (with_single ? "; single: 1 device" : "");
    panels << "\n# panel: " << model << "\n"
           << "set title " << gp_text(panel_title(model, shown, where)) << "\n";
    // Up to five clusters fit a panel with two-line labels; more get one slanted line each.
    if (shown.size() <= 5) {
      panels << "sep = \"\\n\"\nset xtics norotate\nset bmargin 4\n";
    } else {
      panels << "sep = ' '\nset xtics rotate by 30 right\nunset bmargin\n";
    }
    panels << "plot " << gp_path(dat) << " index " << index
           << " using 4:5:6:xtic(label(strcol(1), strcol(2))) title 'device 0' lc rgb '#D55E00', \\\n     "
           << gp_path(dat) << " index " << index << " using 7:8:9 title 'other devices (max)' lc rgb '#56B4E9'\n";
    ++index;
  }
  if (index == 0) {
    p.skipped = "no memory measured";
    return p;
  }
  std::string kind_text;
  for (const auto& k : kinds) {
    kind_text += (kind_text.empty() ? "" : ", ") + memory_kind_text(k) + (k == "replica" && kinds.size() > 1 ? " (*)" : "");
  }
  const std::string title = "Peak memory per device at the widest world — " + setup_text(results) + "\nMiB, " +
                            repeats_text(results) + " (bars: min..max)" +
                            (kind_text.empty() ? "" : "; measured as " + kind_text);
  std::ostringstream s;
  s << preamble("peak memory per device per strategy at the widest world", join_path(dir, "memory.png"), index, title)
    << "impl(s) = s eq 'tandem' ? 'Tandem' : (s eq 'pytorch' ? 'PyTorch' : s)\n"
    << "label(i, s) = impl(i) . sep . s\n"
    << "set style data histograms\n"
    << "set style histogram errorbars gap 1 lw 1\n"
    << "set style fill solid 0.85 border -1\n"
    << "set boxwidth 0.9\n"
    << "set ylabel 'peak memory per device (MiB)'\n"
    << "set yrange [0:*]\n"
    << "set grid ytics lc rgb '#dddddd'\n"
    << "set xtics nomirror scale 0\n"
    << "set key outside top center horizontal font 'sans,10'\n"
    << panels.str() << "unset multiplot\n";
  p.script = s.str();
  p.data = data.str();
  return p;
}

// --- breakdown.png ---------------------------------------------------------------------------

Plot breakdown_plot(const std::string& dir, const Results& results, const std::vector<Row>& rows) {
  Plot p;
  p.name = "breakdown";
  const std::string dat = join_path(dir, "plots/breakdown.dat");
  std::ostringstream data, panels;
  data << "# step-time breakdown (ms, medians) per Tandem strategy at the widest world (tandem bench)\n"
       << "# other_drawn is other_measured clamped at 0; one block per model\n";
  int index = 0;
  bool any_clamp = false;
  for (const auto& model : models_of(results, rows)) {
    std::vector<const Row*> measured;
    int widest = 0;
    for (const auto& r : rows) {
      if (r.model != model || r.impl != "tandem" || r.world < 2 || r.compute_ms.empty() || r.other_ms.empty()) continue;
      measured.push_back(&r);
      widest = std::max(widest, r.world);
    }
    if (measured.empty()) continue;
    data << "# model=" << model << " world=" << widest << "\n"
         << "# strategy compute_ms exposed_comm_ms other_drawn_ms other_measured_ms step_p50_ms\n";
    bool clamp = false;
    std::vector<const Row*> shown;
    for (const Row* r : measured) {
      if (r->world != widest) continue;
      shown.push_back(r);
      const double exposed = r->exposed_comm_ms.empty() ? 0.0 : r->exposed_comm_ms.median;
      const double other = r->other_ms.median;
      if (other < 0) clamp = true;
      data << r->strategy << " " << num(r->compute_ms.median) << " " << num(exposed) << " "
           << num(std::max(other, 0.0)) << " " << num(other) << " " << num(r->p50_ms.median) << "\n";
    }
    data << "\n\n";
    any_clamp = any_clamp || clamp;
    panels << "\n# panel: " << model << "\n"
           << "set title " << gp_text(panel_title(model, shown, plural(widest, "device", "devices"))) << "\n"
           << "plot " << gp_path(dat) << " index " << index
           << " using 2:xtic(1) title 'compute' lc rgb '#0072B2', \\\n     " << gp_path(dat) << " index " << index
           << " using 3 title 'exposed communication' lc rgb '#D55E00', \\\n     " << gp_path(dat) << " index "
           << index << " using 4 title " << gp_text(clamp ? "other (clamped at 0)" : "other") << " lc rgb '#BBBBBB'";
    if (clamp) {  // the stack overstates the step: mark the measured one
      panels << ", \\\n     " << gp_path(dat) << " index " << index
             << " using 0:6 with points pt 2 ps 2 lw 2 lc rgb 'black' title 'measured step (p50)'";
    }
    panels << "\n";
    ++index;
  }
  if (index == 0) {
    p.skipped = "no Tandem strategy with a step breakdown above one device";
    return p;
  }
  const std::string title =
      "Step-time breakdown at the widest world — " + setup_text(results) + "\nms, medians over " +
      plural(results.config.repeats, "repeat", "repeats") + "; compute: the single-device step; other: the rest" +
      "\nexposed communication: DDP's synced step minus its no_sync step" +
      (any_clamp ? "\nother clamped at 0 where negative; x marks the measured step" : "");
  std::ostringstream s;
  s << preamble("step-time breakdown per Tandem strategy at the widest world", join_path(dir, "breakdown.png"), index,
                title)
    << "set style data histograms\n"
    << "set style histogram rowstacked gap 1\n"
    << "set style fill solid 0.85 border -1\n"
    << "set boxwidth 0.6\n"
    << "set ylabel 'step time (ms, p50)'\n"
    << "set yrange [0:*]\n"
    << "set grid ytics lc rgb '#dddddd'\n"
    << "set xtics nomirror scale 0\n"
    << "set key outside top center horizontal font 'sans,10'\n"
    << panels.str() << "unset multiplot\n";
  p.script = s.str();
  p.data = data.str();
  return p;
}

std::vector<Plot> build_plots(const std::string& dir, const Results& results, const Analysis& analysis) {
  // The plots compare strategies on one node; rows across nodes (netns validation runs) would
  // draw a second line per strategy at the same world size.
  std::vector<Row> rows;
  for (const auto& r : analysis.rows) {
    if (r.nodes != 1) continue;
    rows.push_back(r);
    // Note [Backends] in plan.cpp: MPI's rows are series of their own, "ddp(mpi)" (one word: the
    // data files are whitespace-separated); Gloo's keep the plain names.
    if (r.backend == "mpi") rows.back().strategy += kMpiSuffix;
  }
  return {throughput_plot(dir, results, rows), memory_plot(dir, results, rows), breakdown_plot(dir, results, rows)};
}

// --- running gnuplot -------------------------------------------------------------------------

bool executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string search_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return executable_file(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::stringstream ss(dirs);
  std::string d;
  while (std::getline(ss, d, ':')) {
    const std::string candidate = (d.empty() ? "." : d) + "/" + name;
    if (executable_file(candidate)) return candidate;
  }
  return "";
}

// The gnuplot to run, or "" with `why` set.
std::string find_gnuplot(std::string& why) {
  const char* env = std::getenv("TANDEM_GNUPLOT");
  if (env && *env) {
    const std::string found = search_path(env);
    if (found.empty()) why = "gnuplot not found: $TANDEM_GNUPLOT=" + std::string(env) + " is not an executable file";
    return found;
  }
  const std::string found = search_path("gnuplot");
  if (found.empty()) {
    why = "gnuplot not found on PATH (install it, e.g. Debian's gnuplot-nox, or set $TANDEM_GNUPLOT)";
  }
  return found;
}

bool write_file(const std::string& path, const std::string& text, std::string& why) {
  try {
    write_text_file(path, text);
    return true;
  } catch (const Error& e) {
    why = e.what();
    return false;
  }
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// The line of gnuplot's output that says what went wrong: its `"FILE" line N: ...` message when
// it printed one (gnuplot echoes the offending command and a caret first), else the first line.
std::string first_error_line(const std::string& output) {
  std::istringstream in(output);
  std::string line, first;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty()) continue;
    if (first.empty()) first = line;
    if (line.find("\" line ") != std::string::npos) return line;
  }
  return first.empty() ? "(no output)" : first;
}

// Runs `gnuplot script` with stdin from /dev/null and stdout+stderr into a temporary file.
// Returns "" on success, else why not.
std::string run_gnuplot(const std::string& gnuplot, const std::string& script) {
  // A plot takes well under a second; a gnuplot stuck for two minutes is stopped.
  Finished finished;
  std::string output;
  try {
    output = output_of({gnuplot, script}, 120, finished);
  } catch (const Error& e) {
    return "cannot run " + gnuplot + ": " + e.what();
  }
  if (output.size() > (1 << 20)) output.resize(1 << 20);
  const int status = finished.status;
  if (finished.timed_out) return "gnuplot did not finish within 120 s";
  if (WIFSIGNALED(status)) return "gnuplot was killed by signal " + std::to_string(WTERMSIG(status));
  if (WEXITSTATUS(status) != 0) {
    return "gnuplot failed (exit " + std::to_string(WEXITSTATUS(status)) + "): " + first_error_line(output);
  }
  return "";
}

bool non_empty_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
}

std::string join_notes(const std::vector<std::string>& notes) {
  std::string out;
  for (const auto& n : notes) out += (out.empty() ? "" : "; ") + n;
  return out;
}

}  // namespace

PlotInputs plot_inputs(const std::string& dir, const Results& results, const Analysis& analysis) {
  PlotInputs in;
  for (auto& p : build_plots(dir, results, analysis)) {
    if (!p.skipped.empty()) continue;
    in.files.emplace_back("plots/" + p.name + ".dat", std::move(p.data));
    in.files.emplace_back("plots/" + p.name + ".gp", std::move(p.script));
  }
  return in;
}

std::string gnuplot_path_literal(const std::string& path) { return gp_path(path); }

PlotOutcome draw_plots(const std::string& dir, const Results& results, const Analysis& analysis) {
  try {
    return draw_gnuplot_plots(dir, build_plots(dir, results, analysis));
  } catch (const std::exception& e) {
    return PlotOutcome{{}, "plots not drawn: " + std::string(e.what())};
  }
}

PlotOutcome draw_gnuplot_plots(const std::string& dir, const std::vector<GnuplotPlot>& plots) {
  PlotOutcome out;
  try {
    std::string why;
    const std::string gnuplot = find_gnuplot(why);
    if (gnuplot.empty()) {
      out.note = why + "; no plots drawn";
      return out;
    }
    std::vector<std::string> notes;
    const bool any = std::any_of(plots.begin(), plots.end(), [](const Plot& p) { return p.skipped.empty(); });
    if (any) {
      std::error_code ec;
      std::filesystem::create_directories(join_path(dir, "plots"), ec);
      if (ec) {
        out.note = "cannot create " + join_path(dir, "plots") + ": " + ec.message() + "; no plots drawn";
        return out;
      }
    }
    for (const auto& p : plots) {
      const std::string png_name = p.name + ".png";
      if (!p.skipped.empty()) {
        notes.push_back(png_name + " not drawn: " + p.skipped);
        continue;
      }
      const std::string dat = join_path(dir, "plots/" + p.name + ".dat");
      const std::string gp = join_path(dir, "plots/" + p.name + ".gp");
      const std::string png = join_path(dir, png_name);
      if (!write_file(dat, p.data, why) || !write_file(gp, p.script, why)) {
        notes.push_back(png_name + " not drawn: " + why);
        continue;
      }
      ::unlink(png.c_str());  // a stale plot from an earlier run must not pass for this one
      const std::string failed = run_gnuplot(gnuplot, gp);
      if (!failed.empty()) {
        ::unlink(png.c_str());  // gnuplot opens its output before it fails: a partial file
        notes.push_back(png_name + " not drawn: " + failed + " (script: " + gp + ")");
        continue;
      }
      if (!non_empty_file(png)) {
        notes.push_back(png_name + " not drawn: gnuplot exited 0 but wrote no image (script: " + gp + ")");
        continue;
      }
      out.files.push_back(png_name);
    }
    out.note = join_notes(notes);
  } catch (const std::exception& e) {
    out.note = "plots not drawn: " + std::string(e.what());
  }
  return out;
}

}  // namespace tandem::bench
