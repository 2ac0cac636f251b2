#include "comm/failure_report.h"

#include <condition_variable>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "tandem/error.h"

namespace tandem::comm::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string key_of(int rank) { return "tandem/failed_collective/" + std::to_string(rank); }

std::vector<uint8_t> to_bytes(const CollectiveCall& call) {
  std::string text;
  for (auto value : call.encode()) text += std::to_string(value) + " ";
  return {text.begin(), text.end()};
}

CollectiveCall from_bytes(const std::vector<uint8_t>& bytes) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::vector<int64_t> values(CollectiveCall::kEncodedLength, -1);
  for (auto& value : values) in >> value;
  return CollectiveCall::decode(values.data());
}

std::string seconds(std::chrono::milliseconds span) {
  const auto ms = span.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

// What the asking thread found so far; shared with it because it may outlive the caller's wait.
struct Gathered {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::vector<std::optional<CollectiveCall>> calls;
  std::string store_error;
};

void ask(const std::shared_ptr<Gathered>& gathered, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         const CollectiveCall& call, std::chrono::milliseconds window) {
  try {
    store->set(key_of(rank), to_bytes(call));
    const auto deadline = Clock::now() + window;
    for (;;) {
      bool all = true;
      for (int r = 0; r < size; ++r) {
        {
          std::lock_guard<std::mutex> hold(gathered->mutex);
          if (gathered->calls[static_cast<size_t>(r)]) continue;
        }
        if (store->check({key_of(r)})) {
          auto theirs = from_bytes(store->get(key_of(r)));
          std::lock_guard<std::mutex> hold(gathered->mutex);
          gathered->calls[static_cast<size_t>(r)] = theirs;
        } else {
          all = false;
        }
        if (Clock::now() >= deadline) break;
      }
      if (all || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> hold(gathered->mutex);
    gathered->store_error = one_line(e);
  }
  std::lock_guard<std::mutex> hold(gathered->mutex);
  gathered->done = true;
  gathered->done_cv.notify_all();
}

}  // namespace

std::string list_ranks(const std::vector<int>& ranks, const std::vector<int>& global_ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
    const auto r = static_cast<size_t>(ranks[i]);
    if (r < global_ranks.size()) text += " (global " + std::to_string(global_ranks[r]) + ")";
  }
  return text;
}

std::string explain_failure(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const CollectiveCall& call,
                            const std::string& store_owner, const std::vector<int>& global_ranks,
                            std::chrono::milliseconds window) {
  try {
    auto gathered = std::make_shared<Gathered>();
    gathered->calls.resize(static_cast<size_t>(size));
    gathered->calls[static_cast<size_t>(rank)] = call;
    std::thread(ask, gathered, store, rank, size, call, window).detach();

    std::unique_lock<std::mutex> hold(gathered->mutex);
    const bool answered = gathered->done_cv.wait_for(hold, window + std::chrono::seconds(1), [&] { return gathered->done; });
    std::vector<int> silent;
    std::string text;
    for (int r = 0; r < size; ++r) {
      const auto& theirs = gathered->calls[static_cast<size_t>(r)];
      if (!theirs) {
        silent.push_back(r);
      } else if (!theirs->same_call(call)) {
        text += "; rank " + list_ranks({r}, global_ranks) + " was in collective #" + std::to_string(theirs->seq) + ", " +
                theirs->describe_with_shape();
      }
    }
    const bool store_trouble = !answered || !gathered->store_error.empty();
    if (!silent.empty()) {
      const std::string ranks = std::string(silent.size() > 1 ? "ranks " : "rank ") + list_ranks(silent, global_ranks);
      if (store_trouble) {
        text = "; " + ranks + " could not be asked" + text;
      } else {
        text = "; " + ranks + " did not arrive (no report within " + seconds(window) +
               " of the failure: stuck elsewhere, exited, or more than " + seconds(window) + " late)" + text;
      }
    }
    if (!answered) {
      text += "; the store that " + store_owner + " hosts did not answer within " + seconds(window + std::chrono::seconds(1)) +
              " (" + store_owner + " may be stopped)";
    } else if (!gathered->store_error.empty()) {
      text += "; the store that " + store_owner + " hosts failed: " + gathered->store_error + " (" + store_owner +
              " may have exited)";
    }
    return text.empty() ? text : text.substr(2);
  } catch (const std::exception& e) {
    return "the other ranks could not be asked where they are: " + one_line(e);
  }
}

}  // namespace tandem::comm::detail
