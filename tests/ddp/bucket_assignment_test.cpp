// Bucket assignment against c10d's own (tests/oracles/bucket_assignment.json, produced by
// torch.distributed._compute_bucket_assignment_by_size).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tandem/ddp/bucket_assignment.h"
#include "tandem/error.h"

using namespace tandem::ddp;

namespace {

c10::ScalarType dtype_of(const std::string& name) {
  if (name == "float32") return c10::ScalarType::Float;
  if (name == "float64") return c10::ScalarType::Double;
  if (name == "float16") return c10::ScalarType::Half;
  if (name == "int64") return c10::ScalarType::Long;
  throw std::runtime_error("unknown dtype " + name);
}

// Buckets with their limits, sorted: for comparing where only the order is unspecified.
std::vector<std::pair<std::vector<int64_t>, int64_t>> as_set(const std::vector<std::vector<int64_t>>& b,
                                                             const std::vector<int64_t>& l) {
  std::vector<std::pair<std::vector<int64_t>, int64_t>> out;
  for (size_t i = 0; i < b.size(); ++i) out.emplace_back(b[i], l[i]);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(BucketAssignment, MatchesC10dForEveryCaseInTheTable) {
  std::ifstream in(TANDEM_ORACLES_DIR "/bucket_assignment.json");
  ASSERT_TRUE(in);
  const auto table = nlohmann::json::parse(in);
  ASSERT_GE(table.at("cases").size(), 20u);
  for (const auto& c : table.at("cases")) {
    const std::string name = c.at("model").get<std::string>() + "/" + c.at("limits_name").get<std::string>();
    std::vector<TensorSpec> tensors;
    for (const auto& t : c.at("tensors")) {
      tensors.push_back(TensorSpec{t.at("bytes").get<int64_t>(), dtype_of(t.at("dtype").get<std::string>())});
    }
    const auto limits = c.at("size_limits").get<std::vector<int64_t>>();
    auto initial = compute_bucket_assignment(tensors, limits);
    EXPECT_EQ(initial.buckets, c.at("buckets").get<std::vector<std::vector<int64_t>>>()) << name;
    EXPECT_EQ(initial.size_limits, c.at("bucket_limits").get<std::vector<int64_t>>()) << name;

    // Rebuild from an arrival order: the same buckets; their order is exact for the buckets closed
    // by a limit, and for the ones left open at the end PyTorch's order comes from a hash map.
    const auto order = c.at("rebuild_order").get<std::vector<int64_t>>();
    auto rebuilt = compute_bucket_assignment(tensors, limits, order);
    EXPECT_EQ(as_set(rebuilt.buckets, rebuilt.size_limits),
              as_set(c.at("rebuild_buckets").get<std::vector<std::vector<int64_t>>>(),
                     c.at("rebuild_limits").get<std::vector<int64_t>>()))
        << name;
  }
}

TEST(BucketAssignment, FirstBucketIsSmallAndKindsNeverMix) {
  std::vector<TensorSpec> t(10, TensorSpec{512 * 1024, c10::ScalarType::Float});
  t[3].dtype = c10::ScalarType::Double;
  auto a = compute_bucket_assignment(t, {kDefaultFirstBucketBytes, kDefaultBucketBytesCap});
  EXPECT_EQ(a.buckets.front(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(a.size_limits.front(), kDefaultFirstBucketBytes);
  for (const auto& b : a.buckets) {
    const bool has_double = std::count(b.begin(), b.end(), 3) > 0;
    if (has_double) {
      EXPECT_EQ(b.size(), 1u);
    }
  }
}

// ZeRO-2's buckets (Note [Flat shards]): the group is part of a bucket's kind, each kind fills its
// own bucket, and with an order the buckets stay in the order they filled.
TEST(BucketAssignment, GroupsNeverShareABucket) {
  std::vector<TensorSpec> t(6, TensorSpec{400, c10::ScalarType::Float});
  for (size_t i = 0; i < t.size(); ++i) t[i].group = static_cast<int64_t>(i % 2);  // weights, biases, alternating
  auto a = compute_bucket_assignment(t, {1000}, {5, 4, 3, 2, 1, 0});
  EXPECT_EQ(a.buckets, (std::vector<std::vector<int64_t>>{{5, 3, 1}, {4, 2, 0}}));
  auto b = compute_bucket_assignment(t, {800}, {5, 4, 3, 2, 1, 0});
  EXPECT_EQ(b.buckets, (std::vector<std::vector<int64_t>>{{5, 3}, {4, 2}, {1}, {0}}));
}

TEST(BucketAssignment, RejectsBadInput) {
  std::vector<TensorSpec> t(2);
  EXPECT_THROW(compute_bucket_assignment(t, {}), tandem::Error);
  EXPECT_THROW(compute_bucket_assignment(t, {0}), tandem::Error);
  EXPECT_THROW(compute_bucket_assignment(t, {100}, {0, 0}), tandem::Error);
  EXPECT_THROW(compute_bucket_assignment(t, {100}, {0}), tandem::Error);
}
