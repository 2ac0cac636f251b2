#pragma once
// Internal: runs one function per replica, replica 0 on the calling thread and the others on
// threads of their own, and joins them all whatever happens.
#include <cstddef>
#include <functional>
#include <thread>

namespace tandem::dp {

/// Starts a thread running `body` (std::thread by default; tests inject failures).
using ThreadStarter = std::function<std::thread(std::function<void()> body)>;

/// Calls run(k) for k in 0..n-1, run(0) on this thread. `run` must not throw (it records its
/// errors). If a thread cannot be started, the ones already started are joined and a
/// tandem::Error says how many of the n replicas could not start; run(0) is then not called.
void run_replicas(size_t n, const std::function<void(size_t)>& run, const ThreadStarter& start = nullptr);

}  // namespace tandem::dp
