// The comparison table's arithmetic on the fixture (fixture.h): every expected value is worked
// out by hand from the p50 steps there.
#include <gtest/gtest.h>

#include <algorithm>

#include "bench/recommend.h"
#include "bench/summary.h"
#include "fixture.h"

namespace tandem::bench {
namespace {

const Row& row(const std::vector<Row>& rows, const std::string& impl, const std::string& strategy, int world) {
  const Row* r = find_row(rows, "small", impl, strategy, world);
  EXPECT_NE(r, nullptr) << impl << " " << strategy << " x" << world;
  static Row none;
  return r ? *r : none;
}

TEST(Stat, MedianMinMax) {
  auto odd = stat_of({3, 1, 2});
  EXPECT_EQ(odd.median, 2);
  EXPECT_EQ(odd.min, 1);
  EXPECT_EQ(odd.max, 3);
  EXPECT_EQ(stat_of({4, 1, 3, 2}).median, 2.5);  // even count: the mean of the middle two
  EXPECT_TRUE(stat_of({}).empty());
  EXPECT_EQ(stat_of({NAN, 5}).n, 1);  // an undefined figure does not count
}

TEST(Summary, ThroughputAndScaling) {
  const auto rows = summarize(RunIndex(test::fixture()));
  // single: 10 samples / 0.100 s = 100 and 10 / 0.125 = 80 -> median of two = 90.
  const Row& single = row(rows, "tandem", "single", 1);
  EXPECT_DOUBLE_EQ(single.samples_per_s.median, 90);
  EXPECT_DOUBLE_EQ(single.samples_per_s.min, 80);
  EXPECT_DOUBLE_EQ(single.samples_per_s.max, 100);
  // ddp x2: 20 / 0.125 = 160, 20 / 0.15625 = 128 -> 144; per device 72.
  const Row& ddp = row(rows, "tandem", "ddp", 2);
  EXPECT_DOUBLE_EQ(ddp.samples_per_s.median, 144);
  EXPECT_DOUBLE_EQ(ddp.samples_per_s_device.median, 72);
  // Efficiency within each repeat: 80 / 100 = 0.8 and 64 / 80 = 0.8.
  EXPECT_DOUBLE_EQ(ddp.scaling_efficiency.median, 0.8);
  EXPECT_DOUBLE_EQ(ddp.scaling_efficiency.min, 0.8);
  EXPECT_DOUBLE_EQ(ddp.p50_ms.median, (125 + 156.25) / 2);
  EXPECT_EQ(ddp.grad_bytes, 4000000);
  EXPECT_EQ(ddp.buckets, 2);
}

TEST(Summary, ExposedCommunicationBusBandwidthAndBreakdown) {
  const auto rows = summarize(RunIndex(test::fixture()));
  const Row& ddp = row(rows, "tandem", "ddp", 2);
  // 125 - 110 = 15 ms; 156.25 - 137.5 = 18.75 ms -> 16.875.
  EXPECT_NEAR(ddp.exposed_comm_ms.median, 16.875, 1e-9);
  // 4e6 B / 0.004 s * 2(2-1)/2 = 1.0 GB/s; / 0.005 s -> 0.8 GB/s -> 0.9.
  EXPECT_NEAR(ddp.sync_busbw_GBps.median, 0.9, 1e-12);
  // compute = single: 100 and 125 ms; other = 125 - 100 - 15 = 10 and 156.25 - 125 - 18.75 = 12.5.
  EXPECT_NEAR(ddp.compute_ms.median, 112.5, 1e-9);
  EXPECT_NEAR(ddp.other_ms.median, 11.25, 1e-9);
  // The Accelerator carries DDP's exposed comm; its own cost lands in other:
  // 128 - 100 - 15 = 13 and 160 - 125 - 18.75 = 16.25 -> 14.625.
  const Row& acc = row(rows, "tandem", "accelerate", 2);
  EXPECT_NEAR(acc.exposed_comm_ms.median, 16.875, 1e-9);
  EXPECT_NEAR(acc.other_ms.median, 14.625, 1e-9);
  // DataParallel: no exposed comm; other = 250 - 100 = 150 and 312.5 - 125 = 187.5.
  const Row& dp = row(rows, "tandem", "dp-replicate", 2);
  EXPECT_TRUE(dp.exposed_comm_ms.empty());
  EXPECT_NEAR(dp.other_ms.median, 168.75, 1e-9);
  EXPECT_DOUBLE_EQ(dp.mem_primary_MB.median, 300);
  EXPECT_DOUBLE_EQ(dp.mem_others_MB.median, 150);
  EXPECT_DOUBLE_EQ(dp.scaling_efficiency.median, 0.4);  // 40 / 100 and 32 / 80
}

TEST(Summary, RatioAgainstThePeerWithinEachRepeat) {
  const auto rows = summarize(RunIndex(test::fixture()));
  // Tandem ddp 160 vs PyTorch 20 / 0.16 = 125 -> 1.28 (and 128 / 100 in repeat 1).
  const Row& ddp = row(rows, "tandem", "ddp", 2);
  EXPECT_EQ(ddp.peer_strategy, "ddp");
  EXPECT_NEAR(ddp.vs_peer.median, 1.28, 1e-12);
  EXPECT_NEAR(ddp.vs_peer.max, 1.28, 1e-12);
  EXPECT_NEAR(row(rows, "tandem", "single", 1).vs_peer.median, 1.0, 1e-12);
  // No accelerate peer ran, and torch.nn.DataParallel was unsupported: no ratio, no row.
  EXPECT_TRUE(row(rows, "tandem", "accelerate", 2).vs_peer.empty());
  EXPECT_TRUE(row(rows, "tandem", "dp-replicate", 2).vs_peer.empty());
  EXPECT_EQ(find_row(rows, "small", "pytorch", "dp", 2), nullptr);
  // Supporting measurements are not rows of the table.
  EXPECT_EQ(find_row(rows, "small", "tandem", "ddp-no-sync", 2), nullptr);
  EXPECT_EQ(find_row(rows, "small", "tandem", "allreduce", 2), nullptr);
}

TEST(Summary, RunsAcrossNodesAreTheirOwnRows) {
  auto results = test::fixture();
  for (int k : {0, 1}) {  // the same DDP across two nodes: 200 ms, no no_sync run of its own
    bench::Run r = *std::find_if(results.runs.begin(), results.runs.end(), [&](const bench::Run& x) {
      return x.impl == "tandem" && x.strategy == "ddp" && x.repeat == k;
    });
    r.nodes = 2;
    r.p50_s = 0.200 * (k ? 1.25 : 1.0);
    results.runs.push_back(r);
  }
  const auto rows = summarize(RunIndex(results));
  const Row* one = find_row(rows, "small", "tandem", "ddp", 2, 1);
  const Row* two = find_row(rows, "small", "tandem", "ddp", 2, 2);
  ASSERT_TRUE(one && two);
  EXPECT_DOUBLE_EQ(one->samples_per_s.median, 144);  // unchanged by the other node count
  EXPECT_DOUBLE_EQ(two->samples_per_s.median, (100 + 80) / 2.0);  // 20 / 0.2 and 20 / 0.25
  // Exposed against one node's no_sync step: 200 - 110 = 90 and 250 - 137.5 = 112.5 ms.
  EXPECT_NEAR(two->exposed_comm_ms.median, 101.25, 1e-9);
}

TEST(Recommend, TheFastestStrategyWithItsNumbers) {
  const auto rows = summarize(RunIndex(test::fixture()));
  const auto recs = recommend(rows, {"small"});
  ASSERT_EQ(recs.size(), 1u);
  // ddp 144 > accelerate 140.6 (within 5 %, but no less memory) > dp-replicate 72; 144 >= 1.05 * 90.
  EXPECT_EQ(recs[0].strategy, "ddp");
  EXPECT_EQ(recs[0].world, 2);
  EXPECT_NE(recs[0].why.find("144 samples/s"), std::string::npos) << recs[0].why;
  EXPECT_NE(recs[0].why.find("1.60x one device"), std::string::npos) << recs[0].why;
  EXPECT_NE(recs[0].why.find("primary at 300 MiB against 150 MiB"), std::string::npos) << recs[0].why;
}

TEST(Recommend, MemoryBreaksATieOnlyBetweenFiguresOfOneKind) {
  auto results = test::fixture();
  for (auto& r : results.runs) {
    if (r.impl == "tandem" && r.strategy == "dp-replicate") {
      r.p50_s = (r.repeat ? 1.25 : 1.0) * 20 / 140.0;  // 140 and 112 samples/s: within 5 % of ddp's 144
      r.peak_mem_bytes = {50.0 * 1024 * 1024, 40.0 * 1024 * 1024};  // "less" than ddp's 100 MiB RSS
    }
  }
  const auto recs = recommend(summarize(RunIndex(results)), {"small"});
  ASSERT_EQ(recs.size(), 1u);
  // DataParallel's accounting of model bytes is not comparable with a rank's RSS: ddp stays.
  EXPECT_EQ(recs[0].strategy, "ddp");
}

TEST(Recommend, OneDeviceWhenMoreDoNotPay) {
  auto results = test::fixture();
  for (auto& r : results.runs) {
    if (r.impl == "tandem" && r.world == 2) r.p50_s *= 1.95;  // ddp: 20 / 0.24375 = 82 < 90 * 1.05
  }
  const auto recs = recommend(summarize(RunIndex(results)), {"small"});
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].strategy, "single");
  EXPECT_NE(recs[0].why.find("do not pay for themselves"), std::string::npos) << recs[0].why;
}

}  // namespace
}  // namespace tandem::bench
