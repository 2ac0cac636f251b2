#pragma once
// Internal: the one thread of a process that talks to MPI. Compiled only where Tandem is built
// with Open MPI (TANDEM_BUILT_WITH_MPI); mpi.h stays out of every other translation unit.
//
// Note [MPI thread level]: every MPI call of the process, MPI_Init_thread and MPI_Finalize
// included, is made by this thread, so MPI_THREAD_FUNNELED is enough and is what we ask for.
// Collectives are issued by DDP's autograd threads, the training thread and the debug check; one
// thread taking them from a queue keeps them in issue order (MPI requires every rank to call
// collectives on a communicator in the same order) and lets the caller go on while they run,
// which is how the reducer overlaps the bucket all-reduces with backward. MPI_THREAD_MULTIPLE
// would let the callers issue directly, but Open MPI then takes a lock around its progress
// engine on every call, and ordering would again be ours to enforce.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

namespace tandem::comm::detail {

class MpiEngine {
 public:
  /// The process's engine, started (and MPI initialized on its thread) by the first call.
  /// Throws tandem::Error when MPI cannot be initialized or does not give FUNNELED.
  static MpiEngine& instance();

  /// Queues `task` to run on the engine's thread, after every task queued before it. Throws
  /// tandem::Error when the engine is stuck (a collective that timed out never returns) or
  /// finalized.
  void submit(std::function<void()> task);
  /// Runs `task` on the engine's thread and waits for it, rethrowing what it throws.
  void run(const std::function<void()>& task);
  /// From a task only (the engine's thread): calls `poller` whenever the queue is empty, about
  /// every kPollInterval, until it returns true. How p2p requests complete (MPI_Test) without
  /// a blocking wait that would hold up the tasks queued behind them.
  void poll(std::function<bool()> poller);

  /// Called by a waiter whose collective timed out: the engine's thread is inside that call and
  /// will never come back (MPI collectives cannot be cancelled), so later submissions fail at once,
  /// and so do waits for calls queued behind it (stuck() tells them).
  void mark_stuck(const std::string& why);
  /// Why the engine is stuck, or empty.
  std::string stuck() const;

  MpiEngine(const MpiEngine&) = delete;
  MpiEngine& operator=(const MpiEngine&) = delete;

 private:
  MpiEngine();
  void loop();
  /// At exit: MPI_Finalize on the engine's thread when it is idle (mpirun reports a process that
  /// exits without it as a failure); when it is stuck, exit without, and mpirun ends the job.
  static void finalize_at_exit();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::function<bool()>> pollers_;  // the engine's thread only
  bool stopping_ = false;
  std::string stuck_;  // why, once a collective timed out
  std::string init_error_;
  bool initialized_ = false;
  bool we_initialized_ = false;  // MPI_Init was ours, so MPI_Finalize is too
  pid_t pid_ = 0;                // a child made by fork() inherits the exit handler, not the thread
  std::thread thread_;
};

}  // namespace tandem::comm::detail
