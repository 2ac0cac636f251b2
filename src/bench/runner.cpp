#include "bench/runner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "launch/install_layout.h"
#include "launch/worker_process.h"
#include "tandem/error.h"
#include "tandem_version_config.h"

extern char** environ;

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

// Runs argv with its output to `log_path` (or discarded), the environment plus `extra_env`.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path,
            const std::vector<std::string>& extra_env) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  for (const auto& kv : extra_env) {
    const auto key = kv.substr(0, kv.find('=') + 1);
    env.erase(std::remove_if(env.begin(), env.end(), [&](const std::string& e) { return e.rfind(key, 0) == 0; }),
              env.end());
    env.push_back(kv);
  }
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int out = ::open(log_path.empty() ? "/dev/null" : log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TANDEM_CHECK(out >= 0, "cannot create ", log_path, ": ", std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out);
    throw Error(message("cannot start ", argv[0], ": fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    const int null_in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // dup2 clears CLOEXEC on stdin
    if (null_in >= 0) ::dup2(null_in, STDIN_FILENO);
    ::execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(out);
  return pid;
}

// Waits for `pid`; stops it (SIGTERM, then SIGKILL after 10 s) at the deadline or when the bench
// is asked to stop. Returns the wait status; sets `timed_out` / `stopped`.
int wait_bounded(pid_t pid, double timeout_s, bool& timed_out, bool& stopped) {
  const auto start = Clock::now();
  std::optional<Clock::time_point> terminated_at;
  while (true) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) throw Error(message("waitpid: ", std::strerror(errno)));
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (!terminated_at && (elapsed > timeout_s || g_stop_signal)) {
      (g_stop_signal ? stopped : timed_out) = true;
      ::kill(pid, SIGTERM);
      terminated_at = Clock::now();
    }
    if (terminated_at && Clock::now() - *terminated_at > std::chrono::seconds(10)) ::kill(pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string last_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last;
}

// The output of a short command (stdout and stderr together); `what_ended` says "timed out" or
// "interrupted" when it did not end by itself.
std::string output_of(const std::vector<std::string>& argv, int& status, std::string& what_ended) {
  char name[] = "/tmp/tandem-bench-probe-XXXXXX";
  const int fd = ::mkstemp(name);
  TANDEM_CHECK(fd >= 0, "cannot create a temporary file: ", std::strerror(errno));
  ::close(fd);
  struct Unlink {
    const char* path;
    ~Unlink() { ::unlink(path); }
  } unlink_later{name};
  bool timed_out = false, stopped = false;
  status = wait_bounded(spawn(argv, name, {}), 60, timed_out, stopped);
  what_ended = timed_out ? "timed out after 60 s" : (stopped ? "interrupted" : "");
  std::ifstream in(name);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string last_nonempty_line(const std::string& text) {
  std::string line, last;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last;
}

}  // namespace

Tools find_tools(const std::string& python) {
  Tools t;
  t.tandem = launch::install_path("bin/tandem");
  t.worker = launch::install_path("libexec/tandem/tandem-bench-worker");
  t.peer = launch::install_path("share/tandem/bench/peer.py");
  TANDEM_CHECK(executable(t.worker), "the benchmark worker ", t.worker,
               " is missing or not executable: rebuild (scripts/build) or reinstall Tandem");
  t.python = python;
  if (t.python.empty()) {
    if (const char* env = std::getenv("TANDEM_PYTHON"); env && *env) t.python = env;
  }
  if (t.python.empty() && executable(TANDEM_CONFIGURED_PYTHON)) t.python = TANDEM_CONFIGURED_PYTHON;
  if (t.python.empty()) t.python = "/usr/bin/python3";
  install_stop_handlers();
  return t;
}

std::string probe_peers(const Tools& tools, bool need_accelerate, std::string& versions) {
  if (!executable(tools.python)) return tools.python + " is not an executable Python (give --python)";
  if (::access(tools.peer.c_str(), R_OK) != 0) return "the peer script " + tools.peer + " is missing";
  const std::string code = need_accelerate
                               ? "import torch, accelerate; print(torch.__version__, accelerate.__version__)"
                               : "import torch; print(torch.__version__)";
  int status = 0;
  std::string what_ended;
  const std::string out = output_of({tools.python, "-c", code}, status, what_ended);
  if (!what_ended.empty()) return "probing " + tools.python + " for torch " + what_ended;
  const std::string last = last_nonempty_line(out);  // warnings may come first
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return tools.python + " cannot import " + (need_accelerate ? "torch and accelerate" : "torch") + " (" + last + ")";
  }
  versions = last;
  return "";
}

std::vector<std::string> worker_arguments(const BenchConfig& config, const Measurement& m,
                                          const std::string& record_path) {
  const bool data_parallel = m.strategy.rfind("dp", 0) == 0;
  auto batch = config.batch_sizes.find(m.model);
  std::vector<std::string> args{"--model", m.model, "--scale", config.scale, "--strategy", m.strategy,
                                "--batch-size", std::to_string(batch == config.batch_sizes.end() ? 32 : batch->second),
                                "--steps", std::to_string(config.steps), "--warmup", std::to_string(config.warmup),
                                "--precision", config.precision, "--device", config.device,
                                "--threads", std::to_string(config.threads), "--out", record_path};
  if (m.strategy == "sweep") {  // the link fit needs clean points: at least 20 timed all-reduces per size
    args[9] = std::to_string(std::max(config.steps, 20));
    args[11] = std::to_string(std::max(config.warmup, 3));
  }
  if (data_parallel) {
    args.push_back("--replicas");
    args.push_back(std::to_string(m.world));
  }
  return args;
}

Outcome run_measurement(const Tools& tools, const BenchConfig& config, const Planned& planned,
                        const std::string& log_path, const std::string& record_path, double timeout_s) {
  const Measurement& m = planned.measurement;
  const bool data_parallel = m.strategy.rfind("dp", 0) == 0;  // one process, `world` replicas
  std::vector<std::string> argv{tools.tandem, "run", "--nproc-per-node", std::to_string(data_parallel ? 1 : m.world),
                                "--"};
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
  bool timed_out = false, stopped = false;
  pid_t pid = -1;
  try {
    pid = spawn(argv, log_path, {"OMP_NUM_THREADS=" + std::to_string(config.threads)});
  } catch (const Error& e) {  // e.g. the log cannot be created: this measurement fails, the report is still written
    outcome.failure = e.what();
    return outcome;
  }
  const int status = wait_bounded(pid, timeout_s, timed_out, stopped);
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
  const std::string line = last_line_of(record_path);
  if (line.empty()) {
    outcome.failure = "the worker wrote no record to " + record_path + "; log: " + log_path;
    return outcome;
  }
  try {
    Run run = run_from_record(nlohmann::json::parse(line));
    run.repeat = planned.repeat;
    outcome.run = std::move(run);
  } catch (const std::exception& e) {
    outcome.failure = std::string("unreadable record (") + e.what() + "); log: " + log_path;
  }
  return outcome;
}

}  // namespace tandem::bench
