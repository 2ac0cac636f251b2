#include "tandem_version_config.h"
#if TANDEM_BUILT_WITH_MPI
#include "comm/mpi_engine.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <future>

#include <mpi.h>
#include <unistd.h>

#include "tandem/error.h"

namespace tandem::comm::detail {

MpiEngine& MpiEngine::instance() {
  // Never destroyed: its thread may be stuck in a collective at exit, and a joinable std::thread
  // must not be destroyed.
  static MpiEngine* engine = new MpiEngine();
  std::lock_guard<std::mutex> hold(engine->mutex_);
  if (!engine->initialized_) throw Error(engine->init_error_);
  return *engine;
}

MpiEngine::MpiEngine() {
  std::promise<std::string> started;
  auto result = started.get_future();
  thread_ = std::thread([this, &started] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      // The program initialized MPI itself, on another thread: only MULTIPLE lets us call from ours.
      MPI_Query_thread(&provided);
      if (provided < MPI_THREAD_MULTIPLE) {
        started.set_value("MPI was initialized by the program with a thread level below MPI_THREAD_MULTIPLE; "
                          "let Tandem initialize it (do not call MPI_Init), or ask for MPI_THREAD_MULTIPLE");
        return;
      }
    } else if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      started.set_value("MPI_Init_thread failed");
      return;
    } else if (provided < MPI_THREAD_FUNNELED) {
      started.set_value("this MPI library gives only MPI_THREAD_SINGLE; Tandem needs MPI_THREAD_FUNNELED");
      return;
    } else {
      we_initialized_ = true;
    }
    started.set_value("");
    loop();
  });
  init_error_ = result.get();
  if (!init_error_.empty()) {
    thread_.join();
    init_error_ = "initializing MPI failed: " + init_error_;
    return;
  }
  initialized_ = true;
  pid_ = ::getpid();
  // on_exit, not atexit: it gets the exit status (Note [Finalize at exit]). A program that
  // initialized MPI itself finalizes it itself.
  if (we_initialized_) {
    on_exit([](int status, void*) {
      if (status == 0) finalize_at_exit();
    }, nullptr);
  }
}

// Note [Finalize at exit]: mpirun treats a process that exits without MPI_Finalize as failed and
// ends the job, which is what a failing rank wants: MPI_Finalize waits for every other rank to
// reach it too, so a rank that exits with an error after a failure must not call it, or it would
// sit there until the others' collectives time out. A clean exit (status 0) finalizes on the
// engine's thread after what is still queued (a communicator being freed, say), unless the engine
// is stuck; like any MPI program's, it then waits there for the ranks still working (a rank that
// exits 0 with a collective still blocked waits until its peers fail and mpirun ends the job).
void MpiEngine::finalize_at_exit() {
  MpiEngine& engine = instance();
  if (::getpid() != engine.pid_) return;  // a forked child: the engine's thread is not here
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  {
    std::lock_guard<std::mutex> hold(engine.mutex_);
    if (!engine.stuck_.empty() || engine.stopping_) return;
    // Receives that never matched (a peer that failed, or a p2p that timed out) are dropped first:
    // polling them after MPI_Finalize aborts the process (MPI_Test after finalize is an error).
    engine.queue_.emplace_back([&engine] {
      engine.pollers_.clear();
      MPI_Finalize();
    });
    engine.stopping_ = true;
  }
  engine.wake_.notify_all();
  engine.thread_.join();
}

void MpiEngine::loop() {
  // Pending p2p requests are tested this often while nothing else is queued.
  constexpr std::chrono::microseconds kPollInterval{50};
  std::unique_lock<std::mutex> lock(mutex_);
  const auto has_task = [this] { return !queue_.empty(); };
  for (;;) {
    if (pollers_.empty()) {
      wake_.wait(lock, has_task);
    } else {
      wake_.wait_for(lock, kPollInterval, has_task);
    }
    if (!queue_.empty()) {
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();  // tasks report their own failures; they do not throw
      lock.lock();
    }
    if (!pollers_.empty()) {  // after every task too: a stream of collectives must not starve them
      lock.unlock();
      auto done = [](std::function<bool()>& poller) { return poller(); };
      pollers_.erase(std::remove_if(pollers_.begin(), pollers_.end(), done), pollers_.end());
      lock.lock();
    }
    if (stopping_ && queue_.empty()) return;
  }
}

void MpiEngine::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> hold(mutex_);
    if (!stuck_.empty()) throw Error("the MPI backend cannot run more collectives: " + stuck_);
    if (stopping_) throw Error("the MPI backend is finalized (the process is exiting)");
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void MpiEngine::run(const std::function<void()>& task) {
  std::promise<void> done;
  auto finished = done.get_future();
  submit([&task, &done] {
    try {
      task();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  });
  finished.get();
}

void MpiEngine::poll(std::function<bool()> poller) { pollers_.push_back(std::move(poller)); }

void MpiEngine::mark_stuck(const std::string& why) {
  std::lock_guard<std::mutex> hold(mutex_);
  if (stuck_.empty()) stuck_ = why;
}

std::string MpiEngine::stuck() const {
  std::lock_guard<std::mutex> hold(mutex_);
  return stuck_;
}

}  // namespace tandem::comm::detail
#endif
