#pragma once
// Supervisor: the heart of `tandem run`. Starts this node's workers with the torchrun
// environment, pumps their output, and enforces the reliability contract:
//
// Note [Stopping a job]
// - The first worker to fail (non-zero exit or a signal) is the cause: every other worker's
//   process group gets SIGTERM, and SIGKILL after the grace period. The launcher reports the
//   cause (rank, exit code or signal, log file) and exits 1, or restarts every worker when
//   restarts are left (TORCHELASTIC_RESTART_COUNT counts them).
// - SIGINT / SIGTERM to the launcher are forwarded to every worker's group; a second one, or the
//   grace period running out, escalates to SIGKILL. The launcher then exits 128 + signal.
// - Workers die with the launcher (PR_SET_PDEATHSIG), so even `kill -9` leaves no orphans. Under
//   --backend mpi only mpirun has that signal: Open MPI 4.1 leaves its ranks running when mpirun is
//   killed with SIGKILL (docs/guide.md, "Launching with Open MPI").
// - With --backend mpi, mpirun is the one child (Note [Launching through mpirun] in
//   mpirun_command.h) and stopping it is Note [Stopping an mpirun job] in supervisor.cpp.
// - With --nnodes MIN:MAX every attempt is a round of the elastic rendezvous (Note [Elastic
//   rounds]): the round decides this node's ranks and the world, and the rendezvous may ask the
//   workers to stop (SIGTERM, then SIGKILL after the grace period) so that the job goes on with
//   other nodes. Only a failure of this node's own workers counts against --max-restarts.
#include <functional>
#include <string>
#include <vector>

#include "launch/launch_options.h"

namespace tandem::launch {

class WorkerProcess;

class Supervisor {
 public:
  explicit Supervisor(LaunchOptions options);
  /// Runs the job to its end; returns the launcher's exit code.
  int run();

 private:
  enum class Outcome { Succeeded, Failed, Interrupted, Regroup };
  // Where this node's workers are in the job's world for one attempt.
  struct Placement {
    int node_rank = 0, nnodes = 1, world_size = 1, rank_offset = 0, restart_count = 0;
    std::string master_addr;
    int master_port = 0;
  };
  Placement static_placement(int attempt) const;
  // `regroup` is asked on every turn of the loop: a reason to stop the workers for another
  // round, or "" (elastic jobs only).
  Outcome run_attempt(const Placement& placement, const std::function<std::string()>& regroup = {});
  int run_elastic();
  Outcome run_mpirun_attempt(int attempt);  // --backend mpi: Note [Stopping an mpirun job]
  std::vector<std::string> worker_env(int local_rank, const Placement& placement) const;
  void note(const std::string& message) const;
  /// Asks the running workers of `attempt` for their flight records and waits for them a little,
  /// calling `meanwhile` between looks (Note [Flight recorder]).
  void collect_flight_records(std::vector<WorkerProcess>& workers, int attempt, const std::function<void()>& meanwhile);
  /// Prints what the attempt's flight records say, if it left any.
  void report_flight_records(int attempt) const;
  /// `failure` with the message of the exception nothing caught, when SIGABRT ended the failed
  /// worker after std::terminate printed one (uncaught_exception.h). Once its log is complete.
  std::string with_uncaught_exception(const std::string& failure) const;

  LaunchOptions options_;
  int interrupt_signal_ = 0;
  std::string failure_;  // one line about the first failure of the last attempt
  std::string aborted_log_;  // the stderr log of that failure's worker, when SIGABRT ended it
};

}  // namespace tandem::launch
