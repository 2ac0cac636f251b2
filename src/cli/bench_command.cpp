// `tandem bench`: DataParallel, DDP and the Accelerator side by side with PyTorch's own, on this
// machine (docs/benchmarks.md). Plans, runs every measurement through `tandem run`, shows
// progress, and writes the report.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <cstdio>
#include <ctime>
#include <memory>
#include <sstream>

#include "bench/frontier.h"
#include "bench/plan.h"
#include "bench/projection.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "cli/commands.h"
#include "launch/gpu_count.h"
#include "launch/launch_options.h"
#include "tandem/error.h"
#include "tandem/version.h"

namespace tandem::cli {

namespace {

struct Flags {
  std::string models = "small,medium,large";
  std::string strategies = bench::join(bench::default_strategies(), ",");
  std::string nproc = "1,2";
  std::string scale;  // default: cpu on CPU, full on CUDA
  int batch_size = 0;  // 0: each model's default
  std::string project;
  std::string backends = "gloo";
  std::string out = "results/bench";
  double timeout_s = 600;
  std::string memory_budget;  // --memory-budget: the memory frontier instead of the comparison
  std::vector<std::string> argv;
  // Whether these were given (--memory-budget has its own defaults for them).
  bool strategies_given = false, nproc_given = false, steps_given = false;
};


std::string describe(const bench::Measurement& m, bool with_backend) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%-7s %-7s %-13s x%d", m.model.c_str(), m.impl.c_str(), m.strategy.c_str(), m.world);
  std::string out = buf;
  if (with_backend) {
    std::snprintf(buf, sizeof(buf), " %-4s", m.backend.empty() ? "-" : m.backend.c_str());
    out += buf;
  }
  return out;
}

std::string minutes(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f min", seconds / 60);
  return buf;
}

// `tandem bench --memory-budget` (bench/frontier.h): every flag checked before the first probe.
int run_frontier(const bench::BenchConfig& config, const Flags& flags) {
  bench::FrontierConfig fc;
  fc.budget = bench::parse_memory_budget(flags.memory_budget);
  const auto& allowed = bench::frontier_strategies();
  fc.strategies = bench::frontier_default_strategies();
  if (flags.strategies_given) {
    fc.strategies.clear();
    std::stringstream in(flags.strategies);
    for (std::string s; std::getline(in, s, ',');) {
      TANDEM_CHECK(std::find(allowed.begin(), allowed.end(), s) != allowed.end(), "--memory-budget measures ",
                   bench::join(allowed, ", "), " (its probes run no pipeline), not '", s, "'");
      fc.strategies.push_back(s);
    }
  }
  if (flags.nproc_given) {
    const auto worlds = bench::parse_worlds(flags.nproc);
    TANDEM_CHECK(worlds.size() == 1 && worlds[0] >= 2, "--memory-budget: --nproc takes one number of processes, at least 2 (got ",
                 flags.nproc, ")");
    fc.world = worlds[0];
  }
  TANDEM_CHECK(config.device == "cpu", "--memory-budget measures CPU processes (a GPU's memory is not a cgroup's)");
  fc.scale = flags.scale.empty() ? "cpu" : flags.scale;
  TANDEM_CHECK(fc.scale != "full", "--memory-budget: --scale tiny or cpu (the full family is for GPUs)");
  for (const auto& s : fc.strategies) {
    const std::string refusal = bench::frontier_refusal(s, fc.scale, fc.world);
    TANDEM_CHECK(refusal.empty(), "--memory-budget: ", refusal);
  }
  if (flags.steps_given) fc.steps = std::max(2, config.steps);
  fc.timeout_s = flags.timeout_s;
  fc.out = flags.out;
  const auto tools = bench::find_tools(config.python);
  if (config.peers != "off") {
    std::string versions;
    const std::string why = bench::probe_peers(tools, {}, versions);
    TANDEM_CHECK(why.empty() || config.peers != "on", "--peers on: ", why);
    fc.peer = why.empty();
    if (!fc.peer) std::printf("tandem bench: PyTorch peer skipped: %s\n", why.c_str());
  }
  std::string command;
  for (const auto& a : flags.argv) command += (command.empty() ? "" : " ") + a;
  return bench::run_memory_frontier(tools, fc, command);
}

int run_bench(bench::BenchConfig config, const Flags& flags) {
  if (!flags.memory_budget.empty()) return run_frontier(config, flags);
  config.models = bench::parse_list("--models", flags.models, {"small", "medium", "large"});
  config.strategies = bench::parse_strategies(flags.strategies);
  config.worlds = bench::parse_worlds(flags.nproc);
  config.backends = bench::parse_backends(flags.backends, config.device, bench::mpi_backend_built());
  bench::check_sweep_sizes(config.sweep_min_bytes, config.sweep_max_bytes);
  if (std::find(config.backends.begin(), config.backends.end(), "mpi") != config.backends.end()) {
    try {
      launch::find_program("mpirun");  // `tandem run --backend mpi` needs it: fail now, not per measurement
    } catch (const Error&) {
      throw Error("--backends mpi needs Open MPI's mpirun on PATH (Debian: openmpi-bin)");
    }
  }
  config.scale = flags.scale.empty() ? (config.device == "cuda" ? "full" : "cpu") : flags.scale;
  if (flags.batch_size > 0) {
    for (auto& [model, batch] : config.batch_sizes) batch = flags.batch_size;
  }
  if (!flags.project.empty()) {
    std::stringstream in(flags.project);
    for (std::string shape; std::getline(in, shape, ',');) {
      bench::parse_shape(shape);  // a typo fails now, not after ten minutes of measuring
      config.project.push_back(shape);
    }
  }
  for (const auto* link : {&config.link_intra, &config.link_inter}) {
    if (*link != "measured") bench::parse_link(*link);
  }
  if (config.device == "cuda") {
    const int gpus = launch::visible_gpu_count();
    TANDEM_CHECK(gpus > 0, "--device cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver)");
    TANDEM_CHECK(config.worlds.back() <= gpus, "--nproc asks for ", config.worlds.back(), " devices but ", gpus,
                 " CUDA device(s) are visible");
  }
  const auto tools = bench::find_tools(config.python);
  config.python = tools.python;

  bench::Results results;
  results.tandem_version = version();
  results.created_utc = bench::utc_now();
  for (const auto& a : flags.argv) results.command += (results.command.empty() ? "" : " ") + a;
  results.machine = bench::describe_machine();

  // Peers that import more than torch (HF accelerate) are dropped alone when only that is missing.
  std::vector<std::string> modules, needy;  // what they import; the PyTorch strategies that need it
  for (const auto& name : config.strategies) {
    const auto& s = bench::lookup_strategy(name);
    if (s.peer_modules.empty()) continue;
    needy.push_back(s.peer);
    for (const auto& m : s.peer_modules) {
      if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
    }
  }
  bool with_peers = false;
  bool needy_peers = false;
  if (config.peers != "off") {
    std::string versions;
    std::string why = bench::probe_peers(tools, modules, versions);
    TANDEM_CHECK(why.empty() || config.peers != "on", "--peers on: ", why);
    needy_peers = !modules.empty() && why.empty();
    if (!why.empty() && !modules.empty()) {  // torch alone still gives the other peers
      std::string torch_only;
      if (bench::probe_peers(tools, {}, torch_only).empty()) {
        std::vector<std::string> labels;
        for (const auto& peer : needy) labels.push_back(bench::lookup_strategy(peer).peer_label);
        results.peers_note = bench::join(labels, ", ") + " peer skipped: " + why;
        why.clear();
        versions = torch_only;
      }
    }
    with_peers = why.empty();
    if (!with_peers) results.peers_note = "skipped: " + why;
    if (with_peers) std::printf("tandem bench: PyTorch peers from %s (%s)\n", tools.python.c_str(), versions.c_str());
  } else {
    results.peers_note = "off (--peers off)";
  }
  results.config = config;

  auto planned = bench::plan(config, with_peers);
  if (with_peers && !needy_peers) {
    planned.erase(std::remove_if(planned.begin(), planned.end(),
                                 [&](const bench::Planned& p) {
                                   return p.measurement.impl == "pytorch" &&
                                          std::find(needy.begin(), needy.end(), p.measurement.strategy) != needy.end();
                                 }),
                  planned.end());
  }
  std::error_code ec;
  std::filesystem::create_directories(flags.out + "/logs", ec);
  TANDEM_CHECK(!ec, "--out: cannot create ", flags.out, "/logs: ", ec.message());
  std::printf("tandem bench: %zu measurements (%d repeats, %d steps + %d warm-up each, at least %g s of steps) into %s\n",
              planned.size(), config.repeats, config.steps, config.warmup, config.min_seconds, flags.out.c_str());
  std::fflush(stdout);

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> sized;
  bool interrupted = false;
  for (size_t i = 0; i < planned.size(); ++i) {
    const auto& p = planned[i];
    char stem[192];
    std::snprintf(stem, sizeof(stem), "%03zu-%s-%s-%s-w%d%s%s", i + 1, p.measurement.impl.c_str(),
                  p.measurement.model.c_str(), p.measurement.strategy.c_str(), p.measurement.world,
                  p.measurement.backend.empty() ? "" : "-", p.measurement.backend.c_str());
    auto outcome = bench::run_measurement(tools, config, p, flags.out + "/logs/" + stem + ".log",
                                          flags.out + "/logs/" + stem + ".json", flags.timeout_s);
    if (outcome.interrupted) {
      interrupted = true;
      break;
    }
    std::string what;
    if (outcome.run) {
      const auto& run = *outcome.run;
      const auto timing = bench::lookup_strategy(p.measurement.strategy).timing;
      if (!run.unsupported.empty()) {
        what = "not measured: " + run.unsupported;
      } else if (timing == bench::Timing::Sweep) {
        what = std::to_string(run.sweep.size()) + " all-reduce sizes";
      } else {
        char buf[160];
        const bool allreduce = timing == bench::Timing::GradientAllReduce;
        const double per_s = allreduce ? 0 : run.batch_per_device * run.world / run.p50_s;
        if (allreduce) {
          std::snprintf(buf, sizeof(buf), "all-reduce of %.2f MB in %d bucket(s): %.2f ms", run.grad_bytes / 1e6,
                        run.buckets, run.allreduce_p50_s * 1e3);
        } else {
          std::snprintf(buf, sizeof(buf), "p50 %.1f ms, %.0f samples/s", run.p50_s * 1e3, per_s);
        }
        what = buf;
        if (std::find(sized.begin(), sized.end(), run.model) == sized.end()) {
          sized.push_back(run.model);
          std::snprintf(buf, sizeof(buf), "  [%s: %.2f M parameters, %.2f MB of gradients, batch %lld per device]",
                        run.model.c_str(), run.params / 1e6, run.grad_bytes / 1e6,
                        static_cast<long long>(run.batch_per_device));
          what += buf;
        }
      }
      results.runs.push_back(std::move(*outcome.run));
    } else {
      what = "FAILED: " + outcome.failure;
      results.failures.push_back({p.measurement, p.repeat, outcome.failure});
    }
    bench::save_measurements(flags.out, results);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double eta = elapsed / static_cast<double>(i + 1) * static_cast<double>(planned.size() - i - 1);
    std::printf("[%zu/%zu] %s %s: %s  (eta %s)\n", i + 1, planned.size(),
                describe(p.measurement, config.backends.size() > 1 || config.backends.front() != "gloo").c_str(),
                p.repeat < 0 ? "link sweep" : ("repeat " + std::to_string(p.repeat + 1)).c_str(), what.c_str(),
                minutes(eta).c_str());
    std::fflush(stdout);
  }

  auto written = bench::write_report(flags.out, results);
  std::printf("\n");
  for (const auto& rec : written.analysis.recommendations) {
    std::printf("recommendation for %s: %s\n", rec.model.c_str(), bench::recommendation_title(rec).c_str());
  }
  std::printf("tandem bench: wrote");
  for (const auto& f : written.files) std::printf(" %s", f.c_str());
  std::printf("\n");
  if (!written.plot_note.empty()) std::printf("tandem bench: plots: %s\n", written.plot_note.c_str());
  if (interrupted) {
    std::fprintf(stderr, "tandem bench: interrupted; the report holds the %zu measurement(s) taken\n",
                 results.runs.size());
    return 130;
  }
  if (!results.failures.empty()) {
    std::fprintf(stderr, "tandem bench: %zu measurement(s) failed (see the logs named in %s/results.md)\n",
                 results.failures.size(), flags.out.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app, int argc, char** argv) {
  auto* sub = app.add_subcommand("bench", "Measure DataParallel, DDP and the Accelerator against PyTorch on this machine");
  auto config = std::make_shared<bench::BenchConfig>();
  auto flags = std::make_shared<Flags>();
  for (int i = 0; i < argc; ++i) flags->argv.push_back(argv[i]);
  sub->add_option("--models", flags->models, "small (MLP), medium (ResNet-18-class CNN), large (GPT-style decoder)")
      ->capture_default_str();
  std::string groups;
  for (const auto& [group, members] : bench::strategy_groups()) {
    groups += "; " + group + " for " + bench::join(members, ", ");
  }
  sub->add_option("--strategies", flags->strategies, "Any of " + bench::join(bench::user_strategies(), ", ") + groups)
      ->capture_default_str();
  sub->add_option("--nproc", flags->nproc, "World sizes (devices) to measure, e.g. 1,2,4")->capture_default_str();
  sub->add_option("--precision", config->precision, "fp32, bf16 or fp16 (autocast)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))->capture_default_str();
  sub->add_option("--device", config->device, "cpu (Gloo) or cuda (NCCL)")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  sub->add_option("--scale", flags->scale, "Model presets: tiny (tests), cpu, full (default: cpu on CPU, full on CUDA)")
      ->check(CLI::IsMember({"tiny", "cpu", "full"}));
  sub->add_option("--batch-size", flags->batch_size, "Batch per device for every model (default: small 64, medium 32, large 8)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--steps", config->steps, "Timed steps per measurement")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--warmup", config->warmup, "Untimed steps first")->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--min-seconds", config->min_seconds,
                  "Each measurement times more steps than --steps where they take less than this (0: exactly --steps)")
      ->check(CLI::Range(0.0, 3600.0))->capture_default_str();
  sub->add_option("--repeats", config->repeats, "Interleaved repeats of every measurement")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--threads", config->threads, "Intra-op threads per process")->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--peers", config->peers, "PyTorch peers: auto (when --python has torch), on (required), off")
      ->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();
  sub->add_option("--python", config->python, "Python with torch (and accelerate) for the peers");
  sub->add_option("--project", flags->project, "Predict at shapes DEVICESxNODES, e.g. 8x1,8x4 (adds a link sweep)");
  sub->add_option("--link-intra", config->link_intra, "Intra-node link: measured, nvlink, ib100, ... or ALPHA_US:BUSBW_GBPS")
      ->capture_default_str();
  sub->add_option("--link-inter", config->link_inter, "Inter-node link, as --link-intra")->capture_default_str();
  sub->add_option("--backends", flags->backends,
                  "CPU collectives of Tandem's multi-process runs: gloo, mpi or gloo,mpi (PyTorch's always Gloo)")
      ->capture_default_str();
  sub->add_flag("--at-world-one", config->at_world_one,
                "Also measure each strategy at world 1 when --nproc has 1 (one device: the wrapper's own cost)");
  sub->add_flag("--sweep", config->sweep, "Add an all-reduce sweep at every world above one, on every backend");
  sub->add_option("--sweep-min-bytes", config->sweep_min_bytes, "Smallest all-reduce of the sweep (x4 up to the largest)")
      ->capture_default_str();
  sub->add_option("--sweep-max-bytes", config->sweep_max_bytes, "Largest all-reduce of the sweep")->capture_default_str();
  sub->add_option("--microbatches", config->microbatches,
                  "Microbatches per step of the pipeline strategies (pp-*; default: twice the ranks)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--out", flags->out, "Folder for results.json, results.md, the plots and the logs")
      ->capture_default_str();
  sub->add_option("--timeout", flags->timeout_s, "Seconds before a measurement is stopped and reported")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--memory-budget", flags->memory_budget,
                  "Bytes per process (e.g. 2G): the largest GPT each strategy trains under it (a memory cgroup per "
                  "process), instead of the comparison");
  return [config, flags, sub]() {
    flags->strategies_given = sub->get_option("--strategies")->count() > 0;
    flags->nproc_given = sub->get_option("--nproc")->count() > 0;
    flags->steps_given = sub->get_option("--steps")->count() > 0;
    return run_bench(*config, *flags);
  };
}

}  // namespace tandem::cli
