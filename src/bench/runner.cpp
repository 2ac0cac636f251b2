#include "bench/runner.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <fstream>

#include "bench/subprocess.h"
#include "launch/install_layout.h"
#include "launch/worker_process.h"
#include "tandem/error.h"
#include "tandem_version_config.h"

namespace tandem::bench {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int signal) { g_stop_signal = signal; }

// SIGINT/SIGTERM stop the bench between measurements (what was measured is kept) instead of
// killing it mid-write; the running `tandem run` gets the same signal and stops its workers.
void install_stop_handlers() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }


}  // namespace

bool stop_requested() { return g_stop_signal != 0; }

void require_worker(const std::string& what, const std::string& path) {
  TANDEM_CHECK(executable(path), what, " ", path,
               " is missing or not executable: build every target (scripts/build; scripts/demo builds only",
               " the CLI and its example), then reinstall");
}

Tools find_tools(const std::string& python) {
  Tools t;
  t.tandem = launch::install_path("bin/tandem");
  t.worker = launch::install_path("libexec/tandem/tandem-bench-worker");
  t.peer = launch::install_path("share/tandem/bench/peer.py");
  require_worker("the benchmark worker", t.worker);
  t.python = python;
  if (t.python.empty()) {
    if (const char* env = std::getenv("TANDEM_PYTHON"); env && *env) t.python = env;
  }
  if (t.python.empty() && executable(TANDEM_CONFIGURED_PYTHON)) t.python = TANDEM_CONFIGURED_PYTHON;
  if (t.python.empty()) t.python = "/usr/bin/python3";
  install_stop_handlers();
  return t;
}

std::string probe_peers(const Tools& tools, const std::vector<std::string>& modules, std::string& versions) {
  if (!executable(tools.python)) return tools.python + " is not an executable Python (give --python)";
  if (::access(tools.peer.c_str(), R_OK) != 0) return "the peer script " + tools.peer + " is missing";
  std::vector<std::string> imports{"torch"}, shown{"torch.__version__"};
  for (const auto& m : modules) {
    imports.push_back(m);
    shown.push_back(m + ".__version__");
  }
  const std::string code = "import " + join(imports, ", ") + "; print(" + join(shown, ", ") + ")";
  Finished finished;
  const std::string out = output_of({tools.python, "-c", code}, 60, finished, stop_requested);
  if (finished.timed_out) return "probing " + tools.python + " for torch timed out after 60 s";
  if (finished.stopped) return "probing " + tools.python + " for torch interrupted";
  const std::string last = last_nonempty_line(out);  // warnings may come first
  if (!WIFEXITED(finished.status) || WEXITSTATUS(finished.status) != 0) {
    return tools.python + " cannot import " + join(imports, " and ") + " (" + last + ")";
  }
  versions = last;
  return "";
}

bool mpi_backend_built() { return TANDEM_BUILT_WITH_MPI != 0; }

std::vector<std::string> worker_arguments(const BenchConfig& config, const Measurement& m,
                                          const std::string& record_path) {
  const Strategy& s = lookup_strategy(m.strategy);
  const bool sweep = s.timing == Timing::Sweep;
  auto batch = config.batch_sizes.find(m.model);
  std::vector<std::string> args{"--model", m.model, "--scale", config.scale, "--strategy", m.strategy,
                                "--batch-size", std::to_string(batch == config.batch_sizes.end() ? 32 : batch->second),
                                "--steps", std::to_string(config.steps), "--warmup", std::to_string(config.warmup),
                                "--precision", config.precision, "--device", config.device,
                                "--threads", std::to_string(config.threads), "--out", record_path};
  if (sweep) {  // the link fit needs clean points: at least 20 timed all-reduces per size
    args[9] = std::to_string(std::max(config.steps, 20));
    args[11] = std::to_string(std::max(config.warmup, 3));
    args.insert(args.end(), {"--sweep-min-bytes", std::to_string(config.sweep_min_bytes), "--sweep-max-bytes",
                             std::to_string(config.sweep_max_bytes)});
  }
  if (!sweep && config.min_seconds > 0) {  // the sweep keeps its exact count per size
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", config.min_seconds);
    args.insert(args.end(), {"--min-seconds", seconds});
  }
  if (!s.pp_schedule.empty() && config.microbatches > 0) {
    args.insert(args.end(), {"--microbatches", std::to_string(config.microbatches)});
  }
  if (s.launch == Launch::Replicas) {
    args.push_back("--replicas");
    args.push_back(std::to_string(m.world));
  }
  return args;
}

Outcome run_measurement(const Tools& tools, const BenchConfig& config, const Planned& planned,
                        const std::string& log_path, const std::string& record_path, double timeout_s) {
  const Measurement& m = planned.measurement;
  const bool ranks = lookup_strategy(m.strategy).launch == Launch::Ranks;  // else one process
  std::vector<std::string> argv{tools.tandem, "run", "--nproc-per-node", std::to_string(ranks ? m.world : 1)};
  // Note [Backends] in plan.cpp: `--backend mpi` starts the ranks through mpirun. A one-process
  // measurement talks to no other rank; it gets Gloo whatever TANDEM_CPU_BACKEND the caller has.
  if (!m.backend.empty()) {
    argv.push_back("--backend");
    argv.push_back(m.backend);
  }
  argv.push_back("--");
  if (m.impl == "tandem") {
    argv.push_back(tools.worker);
  } else {
    argv.push_back(tools.python);
    argv.push_back(tools.peer);
  }
  for (auto& a : worker_arguments(config, m, record_path)) argv.push_back(a);
  ::unlink(record_path.c_str());
  Outcome outcome;
  if (g_stop_signal) {
    outcome.interrupted = true;
    return outcome;
  }
  const auto start = Clock::now();
  pid_t pid = -1;
  try {
    std::vector<std::string> env{"OMP_NUM_THREADS=" + std::to_string(config.threads)};
    if (m.backend.empty()) env.push_back("TANDEM_CPU_BACKEND=gloo");
    pid = spawn_logged(argv, log_path, env);
  } catch (const Error& e) {  // e.g. the log cannot be created: this measurement fails, the report is still written
    outcome.failure = e.what();
    return outcome;
  }
  const Finished finished = wait_bounded(pid, timeout_s, stop_requested);
  const int status = finished.status;
  const bool timed_out = finished.timed_out, stopped = finished.stopped;
  outcome.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (stopped || g_stop_signal) {
    outcome.interrupted = true;
    return outcome;
  }
  if (timed_out) {
    outcome.failure = message("timed out after ", timeout_s, " s; log: ", log_path);
    return outcome;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    outcome.failure = launch::WorkerProcess::describe_status(status) + "; log: " + log_path;
    return outcome;
  }
  const std::string line = last_nonempty_line(read_text_file(record_path));
  if (line.empty()) {
    outcome.failure = "the worker wrote no record to " + record_path + "; log: " + log_path;
    return outcome;
  }
  try {
    const auto record = nlohmann::json::parse(line);
    Run run = run_from_record(record);
    run.repeat = planned.repeat;
    // The worker names the backend its collectives really ran on: a mismatch is a failure, never
    // a row under the wrong name.
    const std::string said = record.is_object() ? record.value("backend", std::string()) : std::string();
    if (!said.empty() && !m.backend.empty() && said != m.backend) {
      outcome.failure = "asked for backend " + m.backend + ", but the worker's collectives ran on " + said +
                        "; log: " + log_path;
      return outcome;
    }
    run.backend = normal_backend(run.strategy, m.backend);
    outcome.run = std::move(run);
  } catch (const std::exception& e) {
    outcome.failure = std::string("unreadable record (") + e.what() + "); log: " + log_path;
  }
  return outcome;
}

}  // namespace tandem::bench
