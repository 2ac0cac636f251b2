#include "dp/replica_threads.h"

#include <vector>

#include "tandem/error.h"

namespace tandem::dp {

void run_replicas(size_t n, const std::function<void(size_t)>& run, const ThreadStarter& start) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  std::string failure;
  for (size_t k = 1; k < n; ++k) {
    try {
      threads.push_back(start ? start([&run, k] { run(k); }) : std::thread([&run, k] { run(k); }));
    } catch (const std::exception& e) {
      failure = message("DataParallel: cannot start the thread of replica ", k, " of ", n, ": ", one_line(e));
      break;
    }
  }
  if (failure.empty()) run(0);
  for (auto& t : threads) t.join();  // a joinable std::thread destroyed would call std::terminate
  TANDEM_CHECK(failure.empty(), failure);
}

}  // namespace tandem::dp
