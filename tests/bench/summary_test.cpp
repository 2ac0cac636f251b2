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

// The fixture's ddp runs again as `strategy` with tensor parallelism's figures: steps `slower`
// times ddp's, `tp_ms` blocked in 40 TP collectives of 6 MiB per step, the RSS `rss_MiB` on each
// rank, half of ddp's model state per rank (ddp's: 4 + 4 + 4 MiB).
Results with_tensor_parallel(const std::string& strategy, double slower, double tp_ms, double rss_MiB) {
  auto results = test::fixture();
  const int64_t MiB = 1024 * 1024;
  std::vector<Run> added;
  for (auto& r : results.runs) {
    if (r.impl != "tandem" || r.strategy != "ddp") continue;
    r.model_state = {{4 * MiB, 4 * MiB, 4 * MiB}, {4 * MiB, 4 * MiB, 4 * MiB}};
    Run tp = r;
    tp.strategy = strategy;
    tp.p50_s = r.p50_s * slower;
    tp.tp_size = 2;
    tp.tp_comm_s = tp_ms / 1e3;
    tp.tp_comm_bytes = 6 * MiB;
    tp.tp_collectives = 40;
    tp.peak_mem_bytes = {rss_MiB * MiB, rss_MiB * MiB};
    tp.model_state = {{2 * MiB, 2 * MiB, 2 * MiB}, {2 * MiB, 2 * MiB, 2 * MiB}};
    added.push_back(tp);
  }
  results.runs.insert(results.runs.end(), added.begin(), added.end());
  return results;
}

TEST(Summary, TensorParallelCommunicationIsItsTpGroupsTime) {
  auto results = with_tensor_parallel("tp", 1.0, 30, 100);
  for (auto& r : results.runs) {  // fsdp+tp: FSDP's exposed waits are added to the TP group's
    if (r.strategy == "tp" && r.repeat == 1) {
      bench::Run both = r;
      both.strategy = "fsdp+tp";
      both.exposed_gather_s = 0.002;
      both.exposed_reduce_scatter_s = 0.003;
      results.runs.push_back(both);
      break;
    }
  }
  const auto rows = summarize(RunIndex(results));
  const Row& tp = row(rows, "tandem", "tp", 2);
  EXPECT_EQ(tp.tp_size, 2);
  EXPECT_DOUBLE_EQ(tp.tp_comm_ms.median, 30);
  EXPECT_DOUBLE_EQ(tp.exposed_comm_ms.median, 30);  // all exposed: no no_sync twin is asked for
  EXPECT_DOUBLE_EQ(tp.tp_comm_MB.median, 6);
  EXPECT_DOUBLE_EQ(tp.tp_collectives.median, 40);
  EXPECT_DOUBLE_EQ(tp.state_params_MB.median, 2);
  const Row& both = row(rows, "tandem", "fsdp+tp", 2);
  EXPECT_DOUBLE_EQ(both.exposed_comm_ms.median, 35);
  EXPECT_DOUBLE_EQ(both.exposed_gather_ms.median, 2);
  // The DDP row keeps DDP's own figure: synced - no_sync, medians of 15 and 18.75 ms.
  EXPECT_NEAR(row(rows, "tandem", "ddp", 2).exposed_comm_ms.median, 16.875, 1e-9);
}

TEST(Recommend, TensorParallelismThatLosesSaysWhatItPaidAndWhatItBought) {
  // tp at 0.6x ddp's speed, 45 % of its step in its collectives (ddp's median step: 140.625 ms).
  const auto rows = summarize(RunIndex(with_tensor_parallel("tp", 1.0 / 0.6, 0.45 * 140.625 / 0.6, 100)));
  const auto recs = recommend(rows, {"small"});
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].strategy, "ddp");
  const std::string& why = recs[0].why;
  EXPECT_NE(why.find("tp 0.60x (TP group of 2: 45 % of its step blocked in 40 TP collectives, 6.0 MiB per step; "
                     "6.0 MiB of model state per rank against ddp's 12.0)"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("tensor parallelism pays where its memory saving decides"), std::string::npos) << why;
}

TEST(Recommend, TensorParallelismWinsATieOnMemoryAndSaysItPays) {
  // As fast as ddp within 5 % (0.97x), 30 % less on its busiest device.
  const auto rows = summarize(RunIndex(with_tensor_parallel("tp", 1.0 / 0.97, 10, 70)));
  const auto recs = recommend(rows, {"small"});
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].strategy, "tp");
  EXPECT_NE(recs[0].why.find("against ddp's 12.0): tensor parallelism pays here"), std::string::npos)
      << recs[0].why;
  EXPECT_EQ(recs[0].why.find("pays where its memory saving decides"), std::string::npos) << recs[0].why;
}

TEST(Recommend, TensorParallelismThatIsFastestIsRecommended) {
  const auto rows = summarize(RunIndex(with_tensor_parallel("tp", 0.5, 5, 100)));
  const auto recs = recommend(rows, {"small"});
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].strategy, "tp");
  EXPECT_NE(recs[0].why.find("tensor parallelism pays here"), std::string::npos) << recs[0].why;
}

TEST(Summary, PipelineBubbleAndActivationsByRank) {
  const auto rows = summarize(RunIndex(test::with_pipeline()));
  const Row& gpipe = row(rows, "tandem", "pp-gpipe", 2);
  EXPECT_EQ(gpipe.pp_schedule, "gpipe");
  EXPECT_EQ(gpipe.pp_microbatches, 4);
  EXPECT_DOUBLE_EQ(gpipe.pp_bubble_theory, 0.2);
  ASSERT_EQ(gpipe.pp_bubble.size(), 2u);
  EXPECT_DOUBLE_EQ(gpipe.pp_bubble[0].median, 0.35);
  EXPECT_DOUBLE_EQ(gpipe.pp_bubble[1].median, 0.25);
  ASSERT_EQ(gpipe.pp_activation_MB.size(), 2u);
  EXPECT_DOUBLE_EQ(gpipe.pp_activation_MB[0].median, 4);
  EXPECT_DOUBLE_EQ(row(rows, "tandem", "pp-1f1b", 2).pp_activation_MB[1].median, 0.5);
  const Row& peer = row(rows, "pytorch", "pp-1f1b", 2);
  ASSERT_EQ(peer.pp_activation_MB.size(), 2u);
  EXPECT_TRUE(peer.pp_activation_MB[0].empty());  // not measured (-1): no figure, not a zero
  EXPECT_EQ(row(rows, "tandem", "ddp", 2).pp_bubble.size(), 0u);
  // One batch per pipeline: 10 samples per device x 2 a step of 300 ms (repeat 0) or 375 ms.
  EXPECT_NEAR(gpipe.samples_per_s.median, (20 / 0.3 + 20 / 0.375) / 2, 1e-9);
}

TEST(Recommend, APipelineSaysItsBubble) {
  const auto recs = recommend(summarize(RunIndex(test::with_pipeline())), {"small"});
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_NE(recs[0].why.find("pp-gpipe 0.42x (pipeline of 2, 4 microbatches: up to 35 % of a step blocked on its "
                             "neighbours, 20 % in theory)"),
            std::string::npos)
      << recs[0].why;
}

}  // namespace
}  // namespace tandem::bench
