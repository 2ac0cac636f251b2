// The projection section built from a run's records: the link fitted from the sweep, the
// overlap calibrated at the smallest world, and the prediction at the others, by hand.
#include <gtest/gtest.h>

#include "bench/scaling.h"

namespace tandem::bench {
namespace {

Run run(const std::string& strategy, int world, double p50, double backward = 0) {
  Run r;
  r.impl = "tandem";
  r.model = "small";
  r.strategy = strategy;
  r.world = world;
  r.batch_per_device = 10;
  r.grad_bytes = 4000000;
  r.buckets = 2;
  r.bucket_bytes = {1000000, 3000000};
  r.p50_s = r.p95_s = p50;
  r.backward_s = backward;
  return r;
}

// Sweep points from the ring formula with alpha 100 us and busbw 1 GB/s at 2 ranks:
// t = 2(2-1) alpha + 2(2-1)/2 n / busbw = 200 us + n / 1e9.
Results two_rank_run(double cores) {
  Results results;
  results.machine["cores"] = cores;
  results.config.models = {"small"};
  results.config.worlds = {1, 2, 4};
  results.config.project = {"4x1"};
  Run sweep = run("sweep", 2, 0);
  sweep.repeat = -1;
  for (double n : {1e6, 4e6, 16e6}) sweep.sweep.push_back({static_cast<int64_t>(n), 200e-6 + n / 1e9});
  results.runs = {sweep,
                  run("single", 1, 0.100),
                  run("ddp-no-sync", 2, 0.100, 0.060),
                  run("ddp", 2, 0.1038),  // exposed 3.8 ms
                  run("ddp", 4, 0.110)};
  return results;
}

TEST(Scaling, FitCalibrateAndPredict) {
  const auto s = project_run(RunIndex(two_rank_run(/*cores=*/16)));
  ASSERT_TRUE(s.intra.has_value());
  EXPECT_NEAR(s.intra->alpha_s, 100e-6, 1e-12);
  EXPECT_NEAR(s.intra->busbw_Bps, 1e9, 1e-3);
  // At 2 ranks the buckets take 200 us + 1 ms and 200 us + 3 ms: comm 4.4 ms. The measured
  // exposed 3.8 ms needs overlap (4.4 - 3.8) / 60 = 0.01 of the 60 ms backward.
  ASSERT_EQ(s.validation.size(), 3u);  // worlds 1, 2, 4
  EXPECT_EQ(s.validation[0].world, 1);
  EXPECT_NEAR(s.validation[0].predicted_s, 0.100, 1e-12);  // one device: compute alone
  EXPECT_TRUE(s.validation[1].calibration);
  EXPECT_NEAR(s.validation[1].predicted_s, 0.1038, 1e-9);
  // At 4 ranks: per bucket 2*3*100 us + 2*3/4 * n / 1e9 = 2.1 ms and 5.1 ms, comm 7.2 ms;
  // exposed = max(5.1, 7.2 - 0.01 * 60) = 6.6 ms; step 106.6 ms against 110 measured.
  EXPECT_FALSE(s.validation[2].calibration);
  EXPECT_NEAR(s.validation[2].predicted_s, 0.1066, 1e-9);
  EXPECT_NEAR(s.validation[2].error(), (0.1066 - 0.110) / 0.110, 1e-9);
  ASSERT_EQ(s.projections.size(), 1u);
  EXPECT_NEAR(s.projections[0].prediction.step_s, 0.1066, 1e-9);
  EXPECT_NEAR(s.projections[0].prediction.efficiency, 0.100 / 0.1066, 1e-9);
  // One node: a ring inside it whatever the algorithm between nodes.
  EXPECT_NEAR(s.projections[0].tree_prediction.step_s, 0.1066, 1e-9);
}

TEST(Scaling, RingAndHalvingDoublingBetweenNodes) {
  auto results = two_rank_run(/*cores=*/16);
  results.config.project = {"1x4"};  // one device on each of 4 nodes: all on the inter link
  const auto s = project_run(RunIndex(results));  // link_inter: ib100, alpha 5 us, busbw 12 GB/s
  ASSERT_EQ(s.projections.size(), 1u);
  // Ring: 2*3*5 us + 2*3/4 * n / 12e9 = 30 us + 125 us and 30 us + 375 us: comm 560 us;
  // exposed = max(405, 560 - 0.01 * 60 000) = 405 us.
  EXPECT_NEAR(s.projections[0].prediction.step_s, 0.100405, 1e-9);
  // Halving-doubling: 2*2*5 us instead: 145 and 395 us; exposed 395 us.
  EXPECT_NEAR(s.projections[0].tree_prediction.step_s, 0.100395, 1e-9);
}

TEST(Scaling, RanksBeyondTheCoresShareThem) {
  // 2 cores: 4 ranks run two per core, so compute and backward double there:
  // 200 ms + max(5.1, 7.2 - 0.01 * 120) = 200 + 6.0 ms.
  const auto s = project_run(RunIndex(two_rank_run(/*cores=*/2)));
  ASSERT_EQ(s.validation.size(), 3u);
  EXPECT_NEAR(s.validation[2].predicted_s, 0.206, 1e-9);
  // A projected shape has a device per rank: no sharing.
  EXPECT_NEAR(s.projections[0].prediction.step_s, 0.1066, 1e-9);
}

TEST(Scaling, AStepThatWaitsLongerThanTheLinkScalesItsCommunication) {
  auto results = two_rank_run(/*cores=*/16);
  results.runs[3].p50_s = 0.111;  // ddp x2 waits 11 ms: more than the 4.4 ms all-reduce at no overlap
  const auto s = project_run(RunIndex(results));
  ASSERT_EQ(s.validation.size(), 3u);
  // overlap clamps to 0; comm_scale = 11 / 4.4 = 2.5, and the calibration world matches again.
  EXPECT_TRUE(s.validation[1].calibration);
  EXPECT_NEAR(s.validation[1].predicted_s, 0.111, 1e-12);
  ASSERT_EQ(s.projections.size(), 1u);
  EXPECT_NEAR(s.projections[0].overlap, 0.0, 1e-12);
  EXPECT_NEAR(s.projections[0].comm_scale, 2.5, 1e-12);
  // At 4 ranks: 2.5 * 7.2 ms = 18 ms exposed (no overlap): 118 ms.
  EXPECT_NEAR(s.validation[2].predicted_s, 0.118, 1e-9);
  // Across nodes on the ib100 preset the scale is not this machine's to carry: 1x4 unscaled,
  // 30 us + 125 us and 30 us + 375 us, no overlap: exposed max(405, 560) = 560 us.
  results.config.project = {"1x4"};
  const auto preset = project_run(RunIndex(results));
  ASSERT_EQ(preset.projections.size(), 1u);
  EXPECT_EQ(preset.projections[0].comm_scale, 1.0);
  EXPECT_NEAR(preset.projections[0].prediction.step_s, 0.100560, 1e-9);
}

TEST(Scaling, AStepThatWaitsLessThanTheLastBucketScalesItDown) {
  auto results = two_rank_run(/*cores=*/16);
  results.runs[3].p50_s = 0.1016;  // 1.6 ms exposed, half the 3.2 ms last bucket
  const auto s = project_run(RunIndex(results));
  // overlap clamps to 1 (60 ms of backward hides all but the last bucket); comm_scale = 1.6 / 3.2.
  EXPECT_NEAR(s.projections[0].comm_scale, 0.5, 1e-12);
  EXPECT_NEAR(s.validation[1].predicted_s, 0.1016, 1e-12);
  // At 4 ranks: max(0.5 * 5.1, 0.5 * 7.2 - 60) = 2.55 ms exposed.
  EXPECT_NEAR(s.validation[2].predicted_s, 0.10255, 1e-9);
}

TEST(Scaling, ABrokenRecordCostsItsModelTheProjectionNotTheReport) {
  auto results = two_rank_run(/*cores=*/16);
  results.runs[2].p50_s = 0;  // a no_sync step of 0 s: no compute to project from
  const auto s = project_run(RunIndex(results));
  EXPECT_TRUE(s.projections.empty());
  ASSERT_FALSE(s.notes.empty());
  EXPECT_NE(s.notes.back().find("small: no projection: "), std::string::npos) << s.notes.back();
}

TEST(Scaling, AMissingLinkIsANoteNotAGuess) {
  auto results = two_rank_run(16);
  results.runs.erase(results.runs.begin());  // no sweep
  results.config.project = {"4x2"};
  const auto s = project_run(RunIndex(results));
  EXPECT_FALSE(s.intra.has_value());
  EXPECT_TRUE(s.validation.empty());
  ASSERT_FALSE(s.notes.empty());
  EXPECT_NE(s.notes[0].find("'measured' but this run has no sweep"), std::string::npos) << s.notes[0];
  results.config.link_intra = "nvlink";
  EXPECT_EQ(project_run(RunIndex(results)).projections.size(), 1u);  // given links need no sweep
}

}  // namespace
}  // namespace tandem::bench
