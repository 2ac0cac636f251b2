// The pieces behind "collective #N failed; rank R did not arrive" and the debug mode's check:
// the call record, its wire form, and the failure report, over an in-process store standing in
// for the other ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "comm/collective_call.h"
#include "comm/failure_report.h"
#include "tandem/comm/debug.h"
#include "tandem/comm/process_group.h"
#include "tandem/error.h"

namespace tandem::comm::detail {
namespace {

using testing::HasSubstr;

CollectiveCall sum_of(uint64_t seq, const at::Tensor& t) {
  return CollectiveCall::of(seq, CollectiveKind::AllReduce, &t, static_cast<int64_t>(ReduceOp::Sum));
}

TEST(CollectiveCall, DescribesInTheWordsErrorsUse) {
  auto t = at::zeros({2, 3});
  EXPECT_EQ(sum_of(7, t).describe(), "all_reduce of 6 Float on cpu (sum)");
  EXPECT_EQ(sum_of(7, t).describe_with_shape(), "all_reduce (sum) of Float[2, 3] on cpu");
  auto ints = at::zeros({5}, at::kLong);
  EXPECT_EQ(CollectiveCall::of(1, CollectiveKind::Broadcast, &ints, 3).describe_with_shape(),
            "broadcast (root 3) of Long[5] on cpu");
  EXPECT_EQ(CollectiveCall::of(1, CollectiveKind::Barrier, nullptr).describe(), "barrier");
}

TEST(CollectiveCall, WireFormRoundTrips) {
  auto t = at::zeros({2, 1, 3}, at::kDouble);
  const auto call = sum_of(42, t);
  const auto values = call.encode();
  ASSERT_EQ(static_cast<int64_t>(values.size()), CollectiveCall::kEncodedLength);
  const auto back = CollectiveCall::decode(values.data());
  EXPECT_TRUE(back.same_call(call));
  EXPECT_EQ(back.seq, 42u);
  EXPECT_EQ(back.describe_with_shape(), call.describe_with_shape());
}

TEST(CollectiveCall, ManyDimensionsKeepNdimAndNumel) {
  auto t = at::zeros({1, 1, 1, 1, 1, 1, 1, 1, 2, 3});
  const auto back = CollectiveCall::decode(sum_of(1, t).encode().data());
  EXPECT_EQ(back.ndim, 10);
  EXPECT_EQ(back.numel, 6);
  EXPECT_THAT(back.describe_with_shape(), HasSubstr("Float[1, 1, 1, 1, 1, 1, 1, 1, ...]"));
}

TEST(CollectiveCall, SameCallComparesEverythingButTheDeviceIndex) {
  auto a = at::zeros({4});
  auto b = at::zeros({5});
  EXPECT_TRUE(sum_of(3, a).same_call(sum_of(3, a)));
  EXPECT_FALSE(sum_of(3, a).same_call(sum_of(4, a)));  // one rank skipped a call
  EXPECT_FALSE(sum_of(3, a).same_call(sum_of(3, b)));
  EXPECT_FALSE(sum_of(3, a).same_call(sum_of(3, a.to(at::kDouble))));
  auto max = CollectiveCall::of(3, CollectiveKind::AllReduce, &a, static_cast<int64_t>(ReduceOp::Max));
  EXPECT_FALSE(sum_of(3, a).same_call(max));
  auto other_index = sum_of(3, a);
  other_index.device_index = 1;
  EXPECT_TRUE(sum_of(3, a).same_call(other_index));
}

TEST(FailureReport, ListsRanks) {
  EXPECT_EQ(list_ranks({1}), "1");
  EXPECT_EQ(list_ranks({1, 3}), "1 and 3");
  EXPECT_EQ(list_ranks({0, 2, 3}), "0, 2 and 3");
  // A subgroup's ranks, each with its global rank.
  EXPECT_EQ(list_ranks({1}, {2, 3}), "1 (global 3)");
  EXPECT_EQ(list_ranks({0, 1}, {4, 6}), "0 (global 4) and 1 (global 6)");
}

void post(c10d::Store& store, int rank, const CollectiveCall& call) {
  std::string text;
  for (auto v : call.encode()) text += std::to_string(v) + " ";
  store.set("tandem/failed_collective/" + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
}

// Rank 0 of 4 fails at #9: rank 2 reports the same call, rank 1 another one, rank 3 nothing.
TEST(FailureReport, NamesSilentRanksAndRanksElsewhere) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto t = at::zeros({4});
  post(*store, 2, sum_of(9, t));
  post(*store, 1, CollectiveCall::of(9, CollectiveKind::Barrier, nullptr));
  const std::string text = explain_failure(store, 0, 4, sum_of(9, t), "rank 0", {}, std::chrono::milliseconds(200));
  EXPECT_EQ(text,
            "rank 3 did not arrive (no report within 200 ms of the failure: stuck elsewhere, exited, or more than "
            "200 ms late); rank 1 was in collective #9, barrier");
  // Our own report is there for the others to read.
  EXPECT_TRUE(store->check({"tandem/failed_collective/0"}));
}

TEST(FailureReport, EveryoneInTheSameCallSaysNothing) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto t = at::zeros({4});
  post(*store, 1, sum_of(5, t));
  EXPECT_EQ(explain_failure(store, 0, 2, sum_of(5, t), "rank 0", {}, std::chrono::milliseconds(200)), "");
}

// In a subgroup of global ranks {4, 6, 7}: the silent and the elsewhere ranks carry their global rank.
TEST(FailureReport, NamesASubgroupsGlobalRanks) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto t = at::zeros({4});
  post(*store, 1, CollectiveCall::of(2, CollectiveKind::Barrier, nullptr));
  const std::string text =
      explain_failure(store, 0, 3, sum_of(3, t), "rank 0", {4, 6, 7}, std::chrono::milliseconds(200));
  EXPECT_EQ(text,
            "rank 2 (global 7) did not arrive (no report within 200 ms of the failure: stuck elsewhere, exited, or "
            "more than 200 ms late); rank 1 (global 6) was in collective #2, barrier");
}

// A store that fails after rank 1's report was read, or never answers (its host is stopped).
// A store whose other keys fail at once, or (hang) block until release(): the asking thread may
// outlive explain_failure, and holds the store, so release() lets it end.
class TroubledStore : public c10d::HashStore {
 public:
  explicit TroubledStore(bool hang) : hang_(hang) {}
  bool check(const std::vector<std::string>& keys) override {
    if (keys.front() != "tandem/failed_collective/1") {
      if (hang_) {
        std::unique_lock<std::mutex> hold(mutex_);
        released_cv_.wait(hold, [&] { return released_; });
        ++answered_after_hang_;
      }
      throw std::runtime_error("Connection reset by peer");
    }
    return HashStore::check(keys);
  }
  /// Calls that blocked and have since answered (only after release()).
  int answered_after_hang() {
    std::lock_guard<std::mutex> hold(mutex_);
    return answered_after_hang_;
  }
  void release() {
    std::lock_guard<std::mutex> hold(mutex_);
    released_ = true;
    released_cv_.notify_all();
  }

 private:
  bool hang_;
  std::mutex mutex_;
  std::condition_variable released_cv_;
  bool released_ = false;
  int answered_after_hang_ = 0;
};

TEST(FailureReport, AFailingStoreKeepsWhatWasGathered) {
  auto store = c10::make_intrusive<TroubledStore>(/*hang=*/false);
  auto t = at::zeros({4});
  post(*store, 1, CollectiveCall::of(3, CollectiveKind::Barrier, nullptr));
  EXPECT_EQ(explain_failure(store, 0, 3, sum_of(3, t), "the launcher", {}, std::chrono::milliseconds(200)),
            "rank 2 could not be asked; rank 1 was in collective #3, barrier; the store that the launcher hosts "
            "failed: Connection reset by peer (the launcher may have exited)");
}

TEST(FailureReport, AStoreThatNeverAnswersIsNotWaitedFor) {
  auto store = c10::make_intrusive<TroubledStore>(/*hang=*/true);
  auto t = at::zeros({4});
  const std::string text = explain_failure(store, 0, 3, sum_of(3, t), "rank 0", {}, std::chrono::milliseconds(200));
  // It came back before the store answered anything it blocked on: it did not wait for the store
  // (no clock needed; a version that waited would never return, and ctest's timeout would end it).
  EXPECT_EQ(store->answered_after_hang(), 0) << "returned only once the store had answered";
  store->release();
  EXPECT_THAT(text, HasSubstr("the store that rank 0 hosts did not answer within 1200 ms (rank 0 may be stopped)"));
}

TEST(DebugLevel, ParsesPyTorchsValues) {
  EXPECT_EQ(parse_debug_level("DETAIL", "TANDEM_DEBUG"), DebugLevel::Detail);
  EXPECT_EQ(parse_debug_level("detail", "TANDEM_DEBUG"), DebugLevel::Detail);
  EXPECT_EQ(parse_debug_level("INFO", "TANDEM_DEBUG"), DebugLevel::Info);
  EXPECT_EQ(parse_debug_level("off", "TANDEM_DEBUG"), DebugLevel::Off);
  EXPECT_EQ(parse_debug_level("", "TANDEM_DEBUG"), DebugLevel::Off);
  try {
    parse_debug_level("verbose", "TORCH_DISTRIBUTED_DEBUG");
    FAIL() << "accepted 'verbose'";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "TORCH_DISTRIBUTED_DEBUG='verbose' is not a debug level: use OFF, INFO or DETAIL");
  }
}

}  // namespace
}  // namespace tandem::comm::detail
