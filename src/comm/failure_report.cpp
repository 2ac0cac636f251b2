#include "comm/failure_report.h"

#include <sstream>
#include <thread>

#include "tandem/error.h"

namespace tandem::comm::detail {
namespace {

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

}  // namespace

std::string list_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

std::string explain_failure(c10d::Store& store, int rank, int size, const CollectiveCall& call,
                            std::chrono::milliseconds window) {
  using Clock = std::chrono::steady_clock;
  std::vector<bool> reported(static_cast<size_t>(size), false);
  std::vector<CollectiveCall> calls(static_cast<size_t>(size));
  try {
    store.set(key_of(rank), to_bytes(call));
    reported[static_cast<size_t>(rank)] = true;
    calls[static_cast<size_t>(rank)] = call;
    const auto deadline = Clock::now() + window;
    for (;;) {
      bool all = true;
      for (int r = 0; r < size; ++r) {
        if (reported[static_cast<size_t>(r)]) continue;
        if (store.check({key_of(r)})) {
          calls[static_cast<size_t>(r)] = from_bytes(store.get(key_of(r)));
          reported[static_cast<size_t>(r)] = true;
        } else {
          all = false;
        }
      }
      if (all || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception& e) {
    return "the other ranks could not be asked where they are (the store that rank 0 hosts is unreachable: " +
           one_line(e) + "; rank 0 may have exited)";
  }
  std::vector<int> silent;
  std::string elsewhere;
  for (int r = 0; r < size; ++r) {
    const auto& theirs = calls[static_cast<size_t>(r)];
    if (!reported[static_cast<size_t>(r)]) {
      silent.push_back(r);
    } else if (!theirs.same_call(call)) {
      elsewhere += "; rank " + std::to_string(r) + " was in collective #" + std::to_string(theirs.seq) + ", " +
                   theirs.describe_with_shape();
    }
  }
  std::string text;
  if (!silent.empty()) {
    text = "rank" + std::string(silent.size() > 1 ? "s " : " ") + list_ranks(silent) +
           " did not arrive (no report within " + seconds(window) + " of the failure: stuck outside collectives, or exited)";
  }
  if (!elsewhere.empty()) text += (text.empty() ? elsewhere.substr(2) : elsewhere);
  return text;
}

}  // namespace tandem::comm::detail
