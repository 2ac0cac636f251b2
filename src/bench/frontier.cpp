#include "bench/frontier.h"
#include "bench/strategies.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "bench/plots.h"
#include "bench/results.h"
#include "bench/subprocess.h"
#include "launch/install_layout.h"
#include "launch/worker_process.h"
#include "plan/frontier_outlook.h"
#include "plan/model.h"
#include "tandem/error.h"
#include "tandem/version.h"

namespace tandem::bench {

// Note [Memory frontier]
// `tandem bench --memory-budget BYTES` asks each strategy: what is the largest model of one GPT
// family that trains with every process held to BYTES? The budget is the kernel's, not an
// estimate: each rank runs in a memory cgroup of its own (bench/in_memory_cgroup.sh, the same
// wrapper tests/fsdp/memory_budget_test.sh uses), and a rank that needs more is killed by the
// cgroup's OOM killer. A probe is one short multi-process training run of one family member
// (tandem-frontier-worker, or frontier_peer.py for PyTorch): --steps steps with Adam, the first
// warm-up; it fits when every rank exits 0. The family grows in depth and width together, with
// sequence x batch large enough that activations weigh as much as the model state, so that
// sharding the state (ZeRO, FSDP) and recomputing activations (checkpointing) each move the
// frontier. The search doubles the member index (0, 1, 2, 4, 8, ...) until a probe fails, then
// bisects between the last fit and the first failure: about 2 log2(family size) probes per
// strategy. It assumes memory grows with the index (a fit above a failure is not looked for).
// The throughput reported is the tokens/s of the largest member's own probe: measured under the
// budget, in the same run. Peak RSS (getrusage, the largest rank's) differs from what the cgroup
// charges: RSS counts shared-library pages mapped but charged to whoever first read them, the
// cgroup also charges page cache and kernel memory of the rank; neither is the other's bound.

namespace {


bool writable_dir(const std::string& path) { return ::access(path.c_str(), W_OK) == 0; }


std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string millions(double n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f M", n / 1e6);
  return buf;
}

int64_t params_of(const FamilyMember& m) { return plan::frontier_family_model(m.scale, m.index).params(); }

}  // namespace

std::string FamilyMember::shape() const {
  return "L" + std::to_string(layers) + " d" + std::to_string(dim);
}

// The cpu family: 4 sequences of 128 tokens per process (512 tokens: a block's activations, about
// 34 floats per token and width, weigh as much as its weights, gradients and Adam's two moments
// at width ~500), widths 128 .. 608 and depths 2 .. 17 growing together, so each member is about
// 1.3-1.6x the one before. The tiny family (tests): 1 to 6 blocks of width 1024 on 8 tokens
// (activations negligible, compute trivial; every weight at least 4 MiB, so the host allocator maps
// and unmaps it), 12.6 M parameters more per member: about 240 MB more peak RSS under DDP and
// 200 MB under FSDP at 2 processes, coarse enough that a member's fit does not change between runs.
int family_size(const std::string& scale) { return scale == "tiny" ? 6 : 16; }

FamilyMember family_member(const std::string& scale, int index) {
  TANDEM_CHECK(index >= 0 && index < family_size(scale), "family member ", index, " out of range");
  const plan::Model model = plan::frontier_family_model(scale, index);  // the one definition of the family
  FamilyMember m;
  m.index = index;
  m.scale = scale;
  m.vocab = model.vocab, m.context = model.seq, m.dim = model.dim, m.layers = model.layers, m.heads = model.heads;
  m.batch = scale == "tiny" ? 1 : 4;
  return m;
}

const std::vector<std::string>& frontier_strategies() {
  static const std::vector<std::string> names{"ddp", "ddp-checkpoint", "zero1", "zero2", "fsdp", "fsdp-checkpoint",
                                              "tp", "fsdp+tp"};
  return names;
}

const std::vector<std::string>& frontier_default_strategies() {
  static const std::vector<std::string> names{"ddp", "zero1", "zero2", "fsdp", "fsdp-checkpoint"};
  return names;
}

std::string frontier_refusal(const std::string& strategy, const std::string& scale, int world) {
  // The comparison's table decides the TP groups (strategies.cpp: tp over every process, fsdp+tp
  // over pairs); the frontier's own names (ddp-checkpoint, fsdp-checkpoint) have no TP.
  const Strategy* entry = find_strategy(strategy);
  const int tp = entry ? tp_group_size(*entry, world) : 1;
  if (tp == 1) return "";
  if (entry->tp_size == 2 && (world % 2 != 0 || world < 4)) {
    return "fsdp+tp needs a 2-D mesh of at least two tensor-parallel pairs: an even --nproc of at least 4 (got " +
           std::to_string(world) + ")";
  }
  const FamilyMember m = family_member(scale, 0);  // every member has the same heads and vocabulary
  if (m.heads % tp != 0 || m.vocab % tp != 0) {
    return strategy + " cuts the " + scale + " family's " + std::to_string(m.heads) + " heads and " +
           std::to_string(m.vocab) + " classes over " + std::to_string(tp) + " processes: they do not divide";
  }
  return "";
}

int64_t parse_memory_budget(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  const std::map<std::string, double> units{{"", 1},          {"K", 1024.0},   {"KiB", 1024.0},
                                            {"M", 1048576.0}, {"MiB", 1048576.0}, {"G", 1073741824.0},
                                            {"GiB", 1073741824.0}};
  const auto u = units.find(unit);
  TANDEM_CHECK(used > 0 && u != units.end() && value > 0 && value * u->second < 9.2e18,
               "--memory-budget '", text, "': expected bytes per process, e.g. 2147483648, 2048M or 2G");
  const auto bytes = static_cast<int64_t>(value * u->second);
  TANDEM_CHECK(bytes >= (int64_t{128} << 20), "--memory-budget ", text,
               " is too small: a LibTorch training process alone needs about 128 MiB");
  return bytes;
}

MemoryCgroup::MemoryCgroup() {
  std::vector<std::pair<std::string, std::string>> candidates;  // (hierarchy, limit file)
  if (const char* env = std::getenv("TANDEM_MEMORY_CGROUP"); env && *env) {
    const std::string dir = env;
    candidates.emplace_back(dir, ::access((dir + "/cgroup.controllers").c_str(), R_OK) == 0 ? "memory.max"
                                                                                             : "memory.limit_in_bytes");
  } else {
    candidates.emplace_back("/sys/fs/cgroup/memory", "memory.limit_in_bytes");
    const std::string controllers = read_text_file("/sys/fs/cgroup/cgroup.controllers");
    if (controllers.find("memory") != std::string::npos) candidates.emplace_back("/sys/fs/cgroup", "memory.max");
  }
  for (const auto& [dir, limit] : candidates) {
    if (!writable_dir(dir)) continue;
    const std::string root = dir + "/tandem-bench-" + std::to_string(::getpid());
    if (::mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) continue;
    if (limit == "memory.max") {  // v2: the ranks' cgroups below need the memory controller
      std::ofstream(root + "/cgroup.subtree_control") << "+memory";
    }
    root_ = root;
    limit_file_ = limit;
    return;
  }
  std::string tried;
  for (const auto& c : candidates) tried += (tried.empty() ? "" : ", ") + c.first;
  throw Error("--memory-budget needs a writable memory cgroup (tried " + tried +
              "; run as root, or delegate one and name it in $TANDEM_MEMORY_CGROUP)");
}

void MemoryCgroup::remove_ranks() const {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root_, ec)) {
    if (entry.is_directory() && entry.path().filename().string().rfind("rank", 0) == 0) {
      ::rmdir(entry.path().c_str());  // fails only while a process is still in it
    }
  }
}

int64_t MemoryCgroup::peak_charge() const {
  const std::string file = limit_file_ == "memory.max" ? "memory.peak" : "memory.max_usage_in_bytes";
  int64_t peak = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root_, ec)) {
    if (entry.path().filename().string().rfind("rank", 0) != 0) continue;
    try {
      peak = std::max(peak, static_cast<int64_t>(std::stoll(read_text_file(entry.path().string() + "/" + file))));
    } catch (const std::exception&) {  // an older kernel without memory.peak: no figure
    }
  }
  return peak;
}

MemoryCgroup::~MemoryCgroup() {
  remove_ranks();
  ::rmdir(root_.c_str());
}

namespace {

struct Runner {
  const Tools& tools;
  const FrontierConfig& config;
  const MemoryCgroup& cgroup;
  std::string worker, peer, wrapper;
  int probes_run = 0;
  int other_failures = 0;  // probes that failed for another reason than memory: the run fails
  bool interrupted = false;  // SIGINT/SIGTERM: no more probes; the report holds what was measured

  Probe probe(const std::string& impl, const std::string& strategy, int index) {
    const FamilyMember m = family_member(config.scale, index);
    Probe p;
    p.index = index;
    const std::string stem = config.out + "/logs/" + impl + "-" + strategy + "-" + std::to_string(index);
    const std::string record_path = stem + ".json", log_path = stem + ".log";
    ::unlink(record_path.c_str());
    std::vector<std::string> argv{tools.tandem, "run", "--nproc-per-node", std::to_string(config.world), "--",
                                  "/bin/sh", wrapper, cgroup.root(), cgroup.limit_file(),
                                  std::to_string(config.budget)};
    if (impl == "tandem") {
      argv.push_back(worker);
    } else {
      argv.insert(argv.end(), {tools.python, peer});
    }
    argv.insert(argv.end(), {"--strategy", strategy, "--vocab", std::to_string(m.vocab), "--context",
                             std::to_string(m.context), "--dim", std::to_string(m.dim), "--layers",
                             std::to_string(m.layers), "--heads", std::to_string(m.heads), "--batch-size",
                             std::to_string(m.batch), "--steps", std::to_string(config.steps), "--out", record_path});
    const pid_t pid = spawn_logged(argv, log_path, {"OMP_NUM_THREADS=1", "TANDEM_CPU_BACKEND=gloo"});
    const Finished finished = wait_bounded(pid, config.timeout_s, stop_requested);
    p.peak_charge = cgroup.peak_charge();
    cgroup.remove_ranks();
    ++probes_run;
    const std::string log = read_text_file(log_path);
    if (finished.stopped || stop_requested()) {
      p.failure = "stopped (interrupted)";
      interrupted = true;
    } else if (finished.timed_out) {
      p.failure = "timed out after " + std::to_string(static_cast<int>(config.timeout_s)) + " s";
      ++other_failures;
    } else if (!WIFEXITED(finished.status) || WEXITSTATUS(finished.status) != 0) {
      // `tandem run` names the first rank that failed; SIGKILL under a budget is the OOM killer's.
      p.killed = log.find("signal 9 (Killed)") != std::string::npos;
      p.failure = p.killed ? "killed for memory (SIGKILL from the cgroup's OOM killer)"
                           : launch::WorkerProcess::describe_status(finished.status) + ": " + last_nonempty_line(log);
      if (!p.killed) ++other_failures;
    } else {
      try {
        p.record = nlohmann::json::parse(last_nonempty_line(read_text_file(record_path)));
        p.fits = true;
      } catch (const std::exception&) {
        p.failure = "exited 0 but wrote no record (" + record_path + ")";
        ++other_failures;
      }
    }
    std::string what;
    if (p.fits) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "fits: peak RSS %s, cgroup peak %s, %.0f tokens/s",
                    mib(p.record.value("peak_rss_bytes", 0.0)).c_str(), mib(static_cast<double>(p.peak_charge)).c_str(),
                    p.record.value("tokens_per_s", 0.0));
      what = buf;
    } else {
      what = p.failure;
    }
    std::printf("tandem bench: %-7s %-16s model %2d (%s, %s params): %s\n", impl.c_str(), strategy.c_str(), index,
                m.shape().c_str(), millions(static_cast<double>(params_of(m))).c_str(), what.c_str());
    std::fflush(stdout);
    return p;
  }

  // Doubling, then bisection (Note [Memory frontier]).
  FrontierRow search(const std::string& impl, const std::string& strategy) {
    FrontierRow row;
    row.impl = impl;
    row.strategy = strategy;
    const int n = family_size(config.scale);
    std::map<int, Probe> seen;
    auto run = [&](int k) -> const Probe& {
      auto [it, fresh] = seen.emplace(k, Probe{});
      if (fresh && interrupted) {
        it->second.index = k;
        it->second.failure = "not run (interrupted)";
      } else if (fresh) {
        it->second = probe(impl, strategy, k);
        row.probes.push_back(it->second);
      }
      return it->second;
    };
    int lo = -1, hi = n;  // lo fits (or -1), hi fails (or n: past the family)
    for (int k = 0; k < n; k = std::min(n - 1, k == 0 ? 1 : 2 * k)) {
      if (run(k).fits) {
        lo = k;
      } else {
        hi = k;
        break;
      }
      if (k == n - 1) break;
    }
    while (hi - lo > 1 && lo >= 0) {
      const int mid = lo + (hi - lo) / 2;
      (run(mid).fits ? lo : hi) = mid;
    }
    if (lo >= 0) row.largest = seen.at(lo);
    row.next = hi < n ? seen.at(hi) : Probe{};
    row.next.index = hi;
    return row;
  }
};

nlohmann::json member_json(const FamilyMember& m) {
  return {{"index", m.index}, {"shape", m.shape()}, {"vocab", m.vocab}, {"context", m.context}, {"dim", m.dim},
          {"layers", m.layers}, {"heads", m.heads}, {"batch", m.batch}, {"params", params_of(m)}};
}

nlohmann::json row_json(const FrontierRow& r) {
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& p : r.probes) {
    nlohmann::json j{{"index", p.index}, {"fits", p.fits}, {"failure", p.failure}, {"peak_charge_bytes", p.peak_charge}};
    if (p.fits) {
      j["tokens_per_s"] = p.record.value("tokens_per_s", 0.0);
      j["peak_rss_bytes"] = p.record.value("peak_rss_bytes", int64_t{0});
    }
    probes.push_back(j);
  }
  nlohmann::json largest = nullptr;
  if (r.largest.fits) {
    largest = {{"index", r.largest.index},
               {"params", r.largest.record.value("params", int64_t{0})},
               {"peak_rss_bytes", r.largest.record.value("peak_rss_bytes", int64_t{0})},
               {"peak_charge_bytes", r.largest.peak_charge},
               {"tokens_per_s", r.largest.record.value("tokens_per_s", 0.0)}};
  }
  return {{"impl", r.impl},
          {"strategy", r.strategy},
          {"largest", largest},
          {"next", {{"index", r.next.index}, {"failure", r.next.failure}}},
          {"probes", probes}};
}

std::string label_of(const nlohmann::json& row) {
  const std::string s = row.at("strategy");
  return row.at("impl") == "pytorch" ? "PyTorch " + s : "Tandem " + s;
}

GnuplotPlot frontier_plot(const std::string& dir, const nlohmann::json& results) {
  GnuplotPlot plot;
  plot.name = "frontier";
  std::ostringstream data;
  data << "# label largest_params_M tokens_per_s (0: no member fits)\n";
  for (const auto& row : results.at("rows")) {
    const auto& l = row.at("largest");
    data << '"' << label_of(row) << "\" " << (l.is_null() ? 0.0 : l.value("params", 0.0) / 1e6) << ' '
         << (l.is_null() ? 0.0 : l.value("tokens_per_s", 0.0)) << "\n";
  }
  plot.data = data.str();
  const std::string dat = gnuplot_path_literal(dir + "/plots/frontier.dat");
  std::ostringstream gp;
  gp << "# The memory frontier (written by tandem bench --memory-budget; run: gnuplot THIS_FILE)\n"
     << "set terminal pngcairo noenhanced size 1100,460 font 'sans,11'\n"
     << "set output " << gnuplot_path_literal(dir + "/frontier.png") << "\n"
     << "set multiplot layout 1,2 title 'Largest GPT that trains at " << mib(results.value("budget_bytes", 0.0))
     << " per process, " << results.value("world", 0) << " processes' font 'sans,13'\n"
     << "set style data histograms\nset style fill solid 0.8 border -1\nset boxwidth 0.7\nset grid ytics\n"
     << "set xtics rotate by -30 nomirror\nset yrange [0:*]\nunset key\n"
     << "set title 'largest model (M parameters)'\nplot " << dat << " using 2:xtic(1) lc rgb '#0072B2'\n"
     << "set title 'its throughput (tokens/s, all processes)'\nplot " << dat << " using 3:xtic(1) lc rgb '#E69F00'\n"
     << "unset multiplot\n";
  plot.script = gp.str();
  return plot;
}

}  // namespace

std::string render_frontier_markdown(const nlohmann::json& results) {
  std::ostringstream md;
  const double budget = results.value("budget_bytes", 0.0);
  md << "# Memory frontier: the largest model at " << mib(budget) << " per process\n\n"
     << "`" << results.value("command", std::string()) << "` — Tandem " << results.value("tandem_version", std::string())
     << ", " << results.value("created_utc", std::string()) << ".\n\n"
     << results.value("world", 0) << " processes, each in a memory cgroup limited to "
     << static_cast<int64_t>(budget) << " bytes; a probe trains a member of the " << results.value("scale", std::string())
     << " GPT family for " << results.value("steps", 0)
     << " steps with Adam (the first warm-up) and fits when every rank exits 0. Tokens/s: the "
        "largest member's probe, all processes together. Peak RSS (getrusage) and cgroup peak (the kernel's "
        "charge: memory.max_usage_in_bytes or memory.peak): the largest rank's.\n\n"
     << "| strategy | largest model | params | peak RSS | cgroup peak | tokens/s | one larger | how it failed |\n"
     << "|---|---|---:|---:|---:|---:|---|---|\n";
  const auto& family = results.at("family");
  for (const auto& row : results.at("rows")) {
    const auto& l = row.at("largest");
    const auto& next = row.at("next");
    const int ni = next.value("index", 0);
    md << "| " << label_of(row) << " | ";
    if (l.is_null()) {
      md << "none fits | | | | |";
    } else {
      const auto& m = family.at(l.value("index", 0));
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.0f", l.value("tokens_per_s", 0.0));
      md << l.value("index", 0) << ": " << m.value("shape", std::string()) << " | "
         << millions(l.value("params", 0.0)) << " | " << mib(l.value("peak_rss_bytes", 0.0)) << " | "
         << mib(l.value("peak_charge_bytes", 0.0)) << " | " << buf << " |";
    }
    if (ni >= static_cast<int>(family.size())) {
      md << " none: the family's largest fits | |\n";
    } else {
      const auto& m = family.at(ni);
      md << " " << ni << ": " << m.value("shape", std::string()) << " (" << millions(m.value("params", 0.0))
         << ") | " << next.value("failure", std::string()) << " |\n";
    }
  }
  // The comparisons the frontier is for: checkpointing against plain FSDP, Tandem against PyTorch,
  // tensor parallelism against the strategy it extends.
  auto find = [&](const std::string& impl, const std::string& strategy) -> const nlohmann::json* {
    for (const auto& row : results.at("rows")) {
      if (row.at("impl") == impl && row.at("strategy") == strategy) return &row;
    }
    return nullptr;
  };
  auto compare = [&](const nlohmann::json* a, const nlohmann::json* b) {
    if (!a || !b) return;
    const auto& la = a->at("largest");
    const auto& lb = b->at("largest");
    const int ia = la.is_null() ? -1 : la.value("index", -1), ib = lb.is_null() ? -1 : lb.value("index", -1);
    char buf[256];
    std::snprintf(buf, sizeof(buf), "- %s against %s: largest member %d against %d", label_of(*a).c_str(),
                  label_of(*b).c_str(), ia, ib);
    md << buf;
    if (ia > ib) {
      md << ": a larger model.\n";
    } else if (ia == ib && ia >= 0) {
      const double ta = la.value("tokens_per_s", 0.0), tb = lb.value("tokens_per_s", 0.0);
      std::snprintf(buf, sizeof(buf), ": the same model, at %.0f against %.0f tokens/s (%.2fx).\n", ta, tb, tb > 0 ? ta / tb : 0.0);
      md << buf;
    } else {
      md << ": a smaller model.\n";
    }
  };
  md << "\n";
  compare(find("tandem", "fsdp-checkpoint"), find("tandem", "fsdp"));
  compare(find("tandem", "fsdp-checkpoint"), find("pytorch", kFrontierPeer));
  // Where tensor parallelism pays for memory: against the batch-parallel strategy it extends.
  compare(find("tandem", "tp"), find("tandem", "ddp"));
  compare(find("tandem", "fsdp+tp"), find("tandem", "fsdp"));
  // Throughput at equal size: the members both searches trained (a larger model is slower).
  if (const auto *a = find("tandem", "fsdp-checkpoint"), *b = find("pytorch", kFrontierPeer); a && b) {
    std::map<int, double> theirs;
    for (const auto& p : b->at("probes")) {
      if (p.value("fits", false)) theirs[p.value("index", 0)] = p.value("tokens_per_s", 0.0);
    }
    std::string same;
    for (const auto& p : a->at("probes")) {
      const auto t = theirs.find(p.value("index", -1));
      if (!p.value("fits", false) || t == theirs.end() || t->second <= 0) continue;
      char buf[96];
      std::snprintf(buf, sizeof(buf), "%s%d: %.2fx", same.empty() ? "" : ", ", t->first,
                    p.value("tokens_per_s", 0.0) / t->second);
      same += buf;
    }
    if (!same.empty()) {
      md << "- Tandem fsdp-checkpoint ÷ PyTorch fsdp2-checkpoint tokens/s at the members both trained: " << same << ".\n";
    }
  }
  md << "\nThe family (vocabulary, context, batch per process, heads fixed within it):\n\n"
     << "| member | layers | width | vocabulary | context | batch | params |\n|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& m : family) {
    md << "| " << m.value("index", 0) << " | " << m.value("layers", 0) << " | " << m.value("dim", 0) << " | "
       << m.value("vocab", 0) << " | " << m.value("context", 0) << " | " << m.value("batch", 0) << " | "
       << millions(m.value("params", 0.0)) << " |\n";
  }
  md << "\nTensor parallelism (tp, fsdp+tp) trains TP x the batch per TP group: the same tokens per process as "
        "the others. Not measured here: pipeline parallelism (the probes run no "
        "pipeline). RSS and the cgroup's charge differ (docs/benchmarks.md, \"Memory frontier\"): a member can fit with "
        "a peak RSS above the budget.\n";
  md << plan::frontier_outlook(results);
  if (results.contains("plot_note") && !results.at("plot_note").get<std::string>().empty()) {
    md << "\nPlot: " << results.at("plot_note").get<std::string>() << "\n";
  } else {
    md << "\n![frontier](frontier.png)\n";
  }
  return md.str();
}

std::optional<std::string> rerender_frontier(const std::string& dir) {
  nlohmann::json results;
  try {
    results = nlohmann::json::parse(read_text_file(dir + "/results.json"));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (!results.is_object() || results.value("kind", std::string()) != "memory-frontier") return std::nullopt;
  const PlotOutcome plots = draw_gnuplot_plots(dir, {frontier_plot(dir, results)});
  results["plot_note"] = plots.note;
  std::string md = render_frontier_markdown(results);
  write_text_file(dir + "/results.md", md);
  return md;
}

int run_memory_frontier(const Tools& tools, const FrontierConfig& config, const std::string& command) {
  MemoryCgroup cgroup;  // first: no writable cgroup is a one-line error before anything is written
  Runner runner{tools, config, cgroup, launch::install_path("libexec/tandem/tandem-frontier-worker"),
                launch::install_path("share/tandem/bench/frontier_peer.py"),
                launch::install_path("share/tandem/bench/in_memory_cgroup.sh")};
  require_worker("the frontier worker", runner.worker);
  TANDEM_CHECK(::access(runner.wrapper.c_str(), R_OK) == 0, "the cgroup wrapper ", runner.wrapper, " is missing");
  std::error_code ec;
  std::filesystem::create_directories(config.out + "/logs", ec);
  TANDEM_CHECK(!ec, "--out: cannot create ", config.out, "/logs: ", ec.message());

  nlohmann::json results{{"kind", "memory-frontier"},  {"tandem_version", version()}, {"created_utc", utc_now()},
                         {"command", command},         {"budget_bytes", config.budget}, {"world", config.world},
                         {"scale", config.scale},      {"steps", config.steps},       {"cgroup", cgroup.limit_file()}};
  nlohmann::json family = nlohmann::json::array();
  for (int k = 0; k < family_size(config.scale); ++k) family.push_back(member_json(family_member(config.scale, k)));
  results["family"] = family;
  results["rows"] = nlohmann::json::array();
  std::printf("tandem bench: memory frontier at %s per process (%lld bytes), %d processes, %s family of %d models\n",
              mib(static_cast<double>(config.budget)).c_str(), static_cast<long long>(config.budget), config.world,
              config.scale.c_str(), family_size(config.scale));
  std::fflush(stdout);
  std::vector<std::pair<std::string, std::string>> plan;
  for (const auto& s : config.strategies) plan.emplace_back("tandem", s);
  if (config.peer) plan.emplace_back("pytorch", kFrontierPeer);
  for (const auto& [impl, strategy] : plan) {
    FrontierRow row = runner.search(impl, strategy);
    if (runner.interrupted) break;  // a search cut short has no frontier: the row is left out
    results["rows"].push_back(row_json(row));
    write_text_file(config.out + "/results.json", results.dump(2) + "\n");  // kept if the bench is stopped
  }
  const PlotOutcome plots = draw_gnuplot_plots(config.out, {frontier_plot(config.out, results)});
  results["plot_note"] = plots.note;
  write_text_file(config.out + "/results.json", results.dump(2) + "\n");
  write_text_file(config.out + "/results.md", render_frontier_markdown(results));
  std::printf("\n");
  for (const auto& row : results["rows"]) {
    const auto& l = row["largest"];
    std::printf("tandem bench: %-26s largest %s\n", label_of(row).c_str(),
                l.is_null() ? "none"
                            : (std::to_string(l.value("index", 0)) + " (" + millions(l.value("params", 0.0)) + " params, " +
                               std::to_string(static_cast<int64_t>(l.value("tokens_per_s", 0.0))) + " tokens/s)")
                                  .c_str());
  }
  std::printf("tandem bench: %d probes; wrote %s/results.json %s/results.md%s\n", runner.probes_run,
              config.out.c_str(), config.out.c_str(), plots.files.empty() ? "" : (" " + config.out + "/frontier.png").c_str());
  if (!plots.note.empty()) std::printf("tandem bench: plots: %s\n", plots.note.c_str());
  if (runner.interrupted) {
    std::fprintf(stderr, "tandem bench: interrupted; the report holds the probes run\n");
    return 130;
  }
  if (runner.other_failures > 0) {  // counted as "does not fit", but the frontier may be wrong
    std::fprintf(stderr, "tandem bench: %d probe(s) failed for another reason than memory (see %s/logs)\n",
                 runner.other_failures, config.out.c_str());
    return 1;
  }
  return 0;
}

}  // namespace tandem::bench
