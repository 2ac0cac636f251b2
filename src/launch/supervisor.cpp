#include "launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include "tandem/error.h"
#include "launch/elastic_agent.h"
#include "launch/flight_analysis.h"
#include "launch/mpirun_command.h"
#include "launch/mpirun_output.h"
#include "launch/output_pump.h"
#include "launch/process_tree.h"
#include "launch/uncaught_exception.h"
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

// A command line as a shell would take it back (for the note that shows mpirun's).
std::string shell_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    bool plain = !w.empty();
    for (char c : w) plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_./:=,@%+", c));
    std::string quoted = "'";
    for (char c : w) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += (out.empty() ? "" : " ") + (plain ? w : quoted + "'");
  }
  return out;
}

}  // namespace

Supervisor::Supervisor(LaunchOptions options) : options_(std::move(options)) {}

// Note [Flight recorder] (src/comm/flight_recorder.h): before the other workers are stopped, each
// that has a recorder is asked for its record (SIGUSR1), and given up to 3 s to write it, so that
// the analysis sees every rank and not only the one that failed.
void Supervisor::collect_flight_records(std::vector<WorkerProcess>& workers, int attempt,
                                        const std::function<void()>& meanwhile) {
  const std::string folder = options_.log_dir + "/attempt_" + std::to_string(attempt);
  timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const int64_t asked_ns = int64_t{now.tv_sec} * 1000000000 + now.tv_nsec - 10'000'000;  // mtime granularity
  std::vector<int> asked;
  for (auto& w : workers) {
    if (!w.running() || !flight_recorder_armed(folder, w.rank())) continue;
    ::kill(w.pid(), SIGUSR1);
    asked.push_back(w.rank());
  }
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  while (!asked.empty() && Clock::now() < deadline) {
    meanwhile();
    asked.erase(std::remove_if(asked.begin(), asked.end(),
                               [&](int rank) { return flight_dumped_since(folder, rank, asked_ns); }),
                asked.end());
  }
}

std::string Supervisor::with_uncaught_exception(const std::string& failure) const {
  if (aborted_log_.empty()) return failure;
  const auto message = uncaught_exception_message(aborted_log_);
  const char* name = ::strsignal(SIGABRT);
  const std::string mark = std::string("signal ") + std::to_string(SIGABRT) + (name ? std::string(" (") + name + ")" : "");
  const auto at = failure.find(mark);
  if (!message || at == std::string::npos) return failure;
  const auto end = at + mark.size();
  return failure.substr(0, end) + ": uncaught exception: " + *message + failure.substr(end);
}

void Supervisor::report_flight_records(int attempt) const {
  const std::string folder = options_.log_dir + "/attempt_" + std::to_string(attempt);
  try {
    const auto lines = analyze_flight_dumps(read_flight_dumps(folder));
    if (lines.empty()) return;
    constexpr size_t kMostLines = 24;
    for (size_t i = 0; i < lines.size() && i < kMostLines; ++i) note("flight recorder: " + lines[i]);
    if (lines.size() > kMostLines) {
      note("flight recorder: ... " + std::to_string(lines.size() - kMostLines) + " more: tandem doctor " + options_.log_dir);
    }
  } catch (const Error& e) {
    note(std::string("flight recorder: cannot read the records: ") + e.what());
  }
}

void Supervisor::note(const std::string& message) const {
  std::fprintf(stderr, "tandem run: %s\n", message.c_str());
  std::fflush(stderr);
}

Supervisor::Placement Supervisor::static_placement(int attempt) const {
  Placement p;
  p.node_rank = options_.node_rank;
  p.nnodes = options_.nnodes;
  p.world_size = options_.nproc * options_.nnodes;
  p.rank_offset = options_.node_rank * options_.nproc;
  p.restart_count = attempt;
  p.master_addr = options_.master_addr;
  p.master_port = options_.master_port;
  return p;
}

std::vector<std::string> Supervisor::worker_env(int local_rank, const Placement& p) const {
  const int rank = p.rank_offset + local_rank;
  std::map<std::string, std::string> set = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(p.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(options_.nproc)},
      {"GROUP_RANK", std::to_string(p.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(p.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(p.world_size)},
      {"MASTER_ADDR", p.master_addr},
      {"MASTER_PORT", std::to_string(p.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(p.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options_.max_restarts)},
      {"TORCHELASTIC_RUN_ID", options_.run_id},
      // Rank 0 hosts the store: never inherit a torchrun agent's "connect to mine".
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TANDEM_LOG_DIR", options_.log_dir},
  };
  // Our own workers are never one MPI world, even inside an mpirun or srun job whose PMIx or
  // OMPI variables they inherit: auto must not pick MPI for them (docs/design/mpi.md).
  const char* chosen = std::getenv("TANDEM_CPU_BACKEND");
  if (options_.backend == "gloo" || !chosen || !*chosen) set["TANDEM_CPU_BACKEND"] = "gloo";
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

Supervisor::Outcome Supervisor::run_attempt(const Placement& placement, const std::function<std::string()>& regroup) {
  OutputPump pump(options_.log_dir, placement.restart_count);
  std::vector<WorkerProcess> workers;
  workers.reserve(static_cast<size_t>(options_.nproc));
  failure_.clear();

  bool stopping = false, regrouping = false;
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
    spec.rank = placement.rank_offset + local;
    spec.program_path = options_.program_path;
    spec.argv = options_.command;
    spec.env = worker_env(local, placement);
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
        const bool aborted = WIFSIGNALED(*w.status()) && WTERMSIG(*w.status()) == SIGABRT;
        aborted_log_ = aborted ? pump.stderr_log(w.rank()) : "";
        note(failure_ + "; stopping the other workers");
        collect_flight_records(workers, placement.restart_count, [&] {
          std::vector<pollfd> out;
          pump.fill(out);
          ::poll(out.data(), out.size(), 20);
          for (auto& p : out) {
            if (p.revents) pump.on_ready(p.fd);
          }
        });
        begin_stop(SIGTERM);
      }
      all_exited = all_exited && !w.running();
    }
    // Asked on every turn, stopping or not (it is also this node's sign of life to the
    // rendezvous); acted on only while the workers run. Workers that all finished have finished,
    // whatever the rendezvous says next.
    if (regroup && !(all_exited && failure_.empty() && !stopping)) {
      std::string why;
      try {
        why = regroup();
      } catch (const Error& e) {
        if (!stopping) {
          failure_ = e.what();
          note(failure_ + "; stopping the workers");
          begin_stop(SIGTERM);
        }
      }
      if (!why.empty() && !stopping) {
        note("next round: " + why + "; stopping the workers (SIGTERM, SIGKILL after the grace period)");
        regrouping = true;
        begin_stop(SIGTERM);
      }
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
  if (regrouping) return Outcome::Regroup;
  return failure_.empty() ? Outcome::Succeeded : Outcome::Failed;
}

// Note [Elastic rounds], this node's side: join a round, run the workers where it puts them,
// and go round again when they fail or the rendezvous asks.
int Supervisor::run_elastic() {
  note("elastic job: " + std::to_string(options_.nproc) + " worker(s) on this node, --nnodes " + options_.nnodes_spec +
       ", rendezvous " + options_.master_addr + ":" + std::to_string(options_.master_port) + ", run " +
       options_.run_id + ", logs in " + options_.log_dir);
  // A signal while this node waits for the rendezvous ends the launcher, as one during a round does.
  auto signalled = [&] {
    unsigned char sig;
    while (::read(g_signal_pipe[0], &sig, 1) == 1) {
      if (sig != SIGCHLD && !interrupt_signal_) interrupt_signal_ = sig;
    }
    return interrupt_signal_ != 0;
  };
  auto stopped = [&](const char* where) {
    note(std::string("stopped by ") + ::strsignal(interrupt_signal_) + where);
    return 128 + interrupt_signal_;
  };
  std::optional<ElasticAgent> agent;
  try {
    agent.emplace(options_, signalled);
    if (agent->hosts_rendezvous()) note("this node serves the rendezvous");
    for (std::string failure;;) {
      bool counted = false;
      const auto round = agent->next_round(failure, &counted, signalled);
      if (interrupt_signal_) return stopped(" while waiting for a round");
      if (!round) {
        note("the job finished before this node was given a place");
        return 0;
      }
      if (counted) note("restarting after: " + failure + " (one of --max-restarts " + std::to_string(options_.max_restarts) + ")");
      Placement p;
      p.node_rank = round->node_rank;
      p.nnodes = round->nnodes;
      p.world_size = round->world_size;
      p.rank_offset = round->rank_offset;
      p.restart_count = round->round;
      p.master_addr = round->master_addr;
      p.master_port = round->master_port;
      note("round " + std::to_string(round->round) + ": node " + std::to_string(p.node_rank) + " of " +
           std::to_string(p.nnodes) + ", ranks " + std::to_string(p.rank_offset) + ".." +
           std::to_string(p.rank_offset + options_.nproc - 1) + " of a world of " + std::to_string(p.world_size) +
           ", rank 0's store " + p.master_addr + ":" + std::to_string(p.master_port));
      const Outcome outcome = run_attempt(p, [&] { return agent->restart_reason(); });
      if (outcome == Outcome::Succeeded) {
        agent->finish(signalled);
        return 0;
      }
      if (outcome == Outcome::Interrupted) return stopped("");
      failure = outcome == Outcome::Failed ? failure_ : "";
    }
  } catch (const Error& e) {
    if (interrupt_signal_) return stopped(" while waiting for the rendezvous");
    note(std::string("job failed: ") + e.what());
    return 1;
  }
}

// Note [Stopping an mpirun job]
// mpirun puts each local rank in a process group of its own, and when it gets SIGTERM itself it
// waits odls_base_sigkill_timeout before it passes SIGTERM on. So a signal to the launcher goes
// at once to every local rank's group (mpirun's children), as `tandem run` does for its own
// workers; with --hosts also to mpirun, which ends the ranks on the other nodes on Open MPI's
// schedule (SIGTERM after T, SIGKILL after 2T, T = half the grace period). When the grace period
// ends, or on a second signal, mpirun's group and every process below the launcher get SIGKILL:
// the launcher is a child subreaper, so a rank whose mpirun died is still below it. A rank that
// fails is mpirun's to handle: it ends the job and exits non-zero, which the launcher reports
// (naming the rank mpirun named) and restarts or fails on.
Supervisor::Outcome Supervisor::run_mpirun_attempt(int attempt) {
  const int world = options_.nproc * options_.nnodes;
  MpirunOutput output(options_.log_dir, attempt, world);
  failure_.clear();
  std::vector<std::string> inherited;
  for (char** e = environ; *e; ++e) inherited.emplace_back(*e);
  const MpirunCommand command = build_mpirun_command(options_, attempt, ::geteuid() == 0, inherited);
  if (attempt == 0) note("mpirun command: " + shell_words(command.argv));

  WorkerSpec spec;
  spec.program_path = command.argv.front();
  spec.argv = command.argv;
  spec.env = command.env;
  std::optional<WorkerProcess> mpirun;
  try {
    mpirun.emplace(WorkerProcess::spawn(spec));
  } catch (const Error& e) {
    failure_ = e.what();
    return Outcome::Failed;
  }
  output.follow(mpirun->stdout_fd(), mpirun->stderr_fd());
  const pid_t mpirun_pid = mpirun->pid();

  bool stopping = false, mpirun_failed = false;
  int signals_seen = 0;
  Clock::time_point kill_deadline = Clock::time_point::max();
  auto kill_all = [&] {
    mpirun->signal_group(SIGKILL);
    kill_descendants_except(mpirun_pid);
  };
  for (;;) {
    std::vector<pollfd> fds{pollfd{g_signal_pipe[0], POLLIN, 0}};
    output.fill(fds);
    ::poll(fds.data(), fds.size(), 100);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents) output.on_ready(fds[i].fd);
    }
    unsigned char sig;
    while (::read(g_signal_pipe[0], &sig, 1) == 1) {
      if (sig == SIGCHLD) continue;
      ++signals_seen;
      if (!interrupt_signal_) interrupt_signal_ = sig;
      if (signals_seen == 1) {
        note(std::string("got ") + ::strsignal(sig) + ": stopping all ranks (again to kill them)");
        stopping = true;
        kill_deadline = Clock::now() + options_.grace_period;
        for (pid_t rank : children_of(mpirun_pid)) ::kill(-rank, sig), ::kill(rank, sig);
        if (!options_.host_list.empty()) ::kill(mpirun_pid, sig);
      } else {
        kill_all();
      }
    }
    reap_children_except(mpirun_pid);  // orphans that exited
    if (mpirun->running() && mpirun->poll_exit() && !stopping && failed(*mpirun->status())) mpirun_failed = true;
    if (stopping && Clock::now() >= kill_deadline) {
      kill_all();
      kill_deadline = Clock::time_point::max();
    }
    if (!mpirun->running()) break;
  }
  // Whatever mpirun left behind (a rank that outlived it, something a rank started) goes too.
  const int leftover = kill_descendants_except(mpirun_pid);
  if (leftover > 0 && !stopping) note(std::to_string(leftover) + " process(es) outlived mpirun: killed");
  output.drain();
  // After the drain: mpirun writes which rank failed just before it exits, and a loaded machine
  // may reap it before that text was read.
  if (mpirun_failed) {
    const int rank = output.failed_rank();
    failure_ = (rank >= 0 ? "rank " + std::to_string(rank) + " failed (mpirun: " + output.mpirun_summary() + "); "
                          : std::string()) +
               "mpirun ended with " + WorkerProcess::describe_status(*mpirun->status()) + "; its log: " +
               (rank >= 0 ? output.stderr_log(rank) : output.mpirun_log());
  }
  if (!failure_.empty()) note(failure_);
  if (interrupt_signal_) return Outcome::Interrupted;
  return failure_.empty() ? Outcome::Succeeded : Outcome::Failed;
}

int Supervisor::run() {
  SignalScope signals;
  if (options_.elastic) return run_elastic();
  const int world = options_.nproc * options_.nnodes;
  const bool mpi = options_.backend == "mpi";
  if (mpi) {
    // Orphaned ranks (mpirun gone) become our children: findable, killable, reapable.
    become_subreaper();
    note("starting " + std::to_string(world) + " rank(s) through mpirun, " + std::to_string(options_.nproc) +
         " on each of " + std::to_string(options_.nnodes) + " node(s), master " + options_.master_addr + ":" +
         std::to_string(options_.master_port) + ", run " + options_.run_id + ", logs in " + options_.log_dir);
  } else {
    note("starting " + std::to_string(options_.nproc) + " worker(s) on node " +
         std::to_string(options_.node_rank) + "/" + std::to_string(options_.nnodes) + " (world " +
         std::to_string(world) + "), master " + options_.master_addr + ":" +
         std::to_string(options_.master_port) + ", run " + options_.run_id + ", logs in " +
         options_.log_dir);
  }
  for (int attempt = 0;; ++attempt) {
    Outcome outcome = mpi ? run_mpirun_attempt(attempt) : run_attempt(static_placement(attempt));
    if (outcome == Outcome::Succeeded) return 0;
    if (outcome == Outcome::Interrupted) {
      note(std::string("stopped by ") + ::strsignal(interrupt_signal_));
      return 128 + interrupt_signal_;
    }
    report_flight_records(attempt);
    if (attempt < options_.max_restarts) {
      note(std::string(mpi ? "restarting mpirun and every rank" : "restarting all workers") + " (restart " + std::to_string(attempt + 1) + " of " +
           std::to_string(options_.max_restarts) + ")");
      continue;
    }
    note("job failed: " + with_uncaught_exception(failure_) +
         (options_.max_restarts ? " (after " + std::to_string(options_.max_restarts) + " restarts)" : ""));
    return 1;
  }
}

}  // namespace tandem::launch
