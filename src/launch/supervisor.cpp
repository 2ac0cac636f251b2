#include "launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "tandem/error.h"
#include "launch/output_pump.h"
#include "launch/worker_process.h"

extern char** environ;

namespace tandem::launch {
namespace {

using Clock = std::chrono::steady_clock;

// Signals reach the poll loop through a self-pipe: the handler only writes the signal number.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

class SignalScope {
 public:
  SignalScope() {
    if (g_signal_pipe[0] < 0 && ::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Error(std::string("cannot create signal pipe: ") + std::strerror(errno));
    }
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::sigaction(sig, &sa, &old_[sig]);
    struct sigaction ignore{};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &old_[SIGPIPE]);
  }
  ~SignalScope() {
    for (auto& [sig, action] : old_) ::sigaction(sig, &action, nullptr);
  }

 private:
  std::map<int, struct sigaction> old_;
};

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

}  // namespace

Supervisor::Supervisor(LaunchOptions options) : options_(std::move(options)) {}

void Supervisor::note(const std::string& message) const {
  std::fprintf(stderr, "tandem run: %s\n", message.c_str());
  std::fflush(stderr);
}

std::vector<std::string> Supervisor::worker_env(int local_rank, int attempt) const {
  const int world_size = options_.nproc * options_.nnodes;
  const int rank = options_.node_rank * options_.nproc + local_rank;
  std::map<std::string, std::string> set = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(options_.nproc)},
      {"GROUP_RANK", std::to_string(options_.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(options_.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world_size)},
      {"MASTER_ADDR", options_.master_addr},
      {"MASTER_PORT", std::to_string(options_.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options_.max_restarts)},
      {"TORCHELASTIC_RUN_ID", options_.run_id},
      // Rank 0 hosts the store: never inherit a torchrun agent's "connect to mine".
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TANDEM_LOG_DIR", options_.log_dir},
  };
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    if (!set.count(entry.substr(0, entry.find('=')))) env.push_back(entry);
  }
  // Several workers on one host would oversubscribe the cores with one OpenMP pool each.
  if (options_.nproc > 1 && !std::getenv("OMP_NUM_THREADS")) env.push_back("OMP_NUM_THREADS=1");
  for (const auto& [key, value] : set) env.push_back(key + "=" + value);
  return env;
}

Supervisor::Outcome Supervisor::run_attempt(int attempt) {
  OutputPump pump(options_.log_dir, attempt);
  std::vector<WorkerProcess> workers;
  workers.reserve(static_cast<size_t>(options_.nproc));
  failure_.clear();

  bool stopping = false;
  int signals_seen = 0;
  Clock::time_point kill_deadline = Clock::time_point::max();
  auto stop_all = [&](int sig) {
    for (auto& w : workers) w.signal_group(sig);
  };
  auto begin_stop = [&](int sig) {
    if (!stopping) kill_deadline = Clock::now() + options_.grace_period;
    stopping = true;
    stop_all(sig);
  };

  for (int local = 0; local < options_.nproc; ++local) {
    WorkerSpec spec;
    spec.local_rank = local;
    spec.rank = options_.node_rank * options_.nproc + local;
    spec.program_path = options_.program_path;
    spec.argv = options_.command;
    spec.env = worker_env(local, attempt);
    try {
      workers.push_back(WorkerProcess::spawn(spec));
    } catch (const Error& e) {
      failure_ = std::string("rank ") + std::to_string(spec.rank) + ": " + e.what();
      begin_stop(SIGKILL);
      break;
    }
    pump.add(spec.rank, workers.back().stdout_fd(), workers.back().stderr_fd());
  }

  for (;;) {
    std::vector<pollfd> fds{pollfd{g_signal_pipe[0], POLLIN, 0}};
    pump.fill(fds);
    int timeout_ms = 100;
    ::poll(fds.data(), fds.size(), timeout_ms);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents) pump.on_ready(fds[i].fd);
    }
    unsigned char sig;
    while (::read(g_signal_pipe[0], &sig, 1) == 1) {
      if (sig == SIGCHLD) continue;  // reaping happens below on every turn
      ++signals_seen;
      if (!interrupt_signal_) interrupt_signal_ = sig;
      if (signals_seen == 1) {
        note(std::string("got ") + ::strsignal(sig) + ": stopping all workers (again to kill them)");
        begin_stop(sig);
      } else {
        stop_all(SIGKILL);
      }
    }

    bool all_exited = true;
    for (auto& w : workers) {
      if (w.running() && w.poll_exit() && !stopping && failed(*w.status())) {
        failure_ = "rank " + std::to_string(w.rank()) + " (local rank " + std::to_string(w.local_rank()) +
                   ", pid " + std::to_string(w.pid()) + ") failed with " +
                   WorkerProcess::describe_status(*w.status()) + "; its log: " + pump.stderr_log(w.rank());
        note(failure_ + "; stopping the other workers");
        begin_stop(SIGTERM);
      }
      all_exited = all_exited && !w.running();
    }
    if (stopping && Clock::now() >= kill_deadline) {
      stop_all(SIGKILL);
      kill_deadline = Clock::time_point::max();
    }
    if (all_exited) break;
  }
  // Everything a worker started in its group goes with it.
  stop_all(SIGKILL);
  pump.drain();
  if (interrupt_signal_) return Outcome::Interrupted;
  return failure_.empty() ? Outcome::Succeeded : Outcome::Failed;
}

int Supervisor::run() {
  SignalScope signals;
  const int world = options_.nproc * options_.nnodes;
  note("starting " + std::to_string(options_.nproc) + " worker(s) on node " +
       std::to_string(options_.node_rank) + "/" + std::to_string(options_.nnodes) + " (world " +
       std::to_string(world) + "), master " + options_.master_addr + ":" +
       std::to_string(options_.master_port) + ", run " + options_.run_id + ", logs in " +
       options_.log_dir);
  for (int attempt = 0;; ++attempt) {
    Outcome outcome = run_attempt(attempt);
    if (outcome == Outcome::Succeeded) return 0;
    if (outcome == Outcome::Interrupted) {
      note(std::string("stopped by ") + ::strsignal(interrupt_signal_));
      return 128 + interrupt_signal_;
    }
    if (attempt < options_.max_restarts) {
      note("restarting all workers (restart " + std::to_string(attempt + 1) + " of " +
           std::to_string(options_.max_restarts) + ")");
      continue;
    }
    note("job failed: " + failure_ +
         (options_.max_restarts ? " (after " + std::to_string(options_.max_restarts) + " restarts)" : ""));
    return 1;
  }
}

}  // namespace tandem::launch
