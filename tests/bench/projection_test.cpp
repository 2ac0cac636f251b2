// The alpha-beta projection of `tandem bench --project` (Note [Projection] in
// src/bench/projection.cpp). Every expected value is worked out by hand in the comment beside it;
// units: us = 1e-6 s, ms = 1e-3 s, GB/s = 1e9 bytes/s.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench/projection.h"
#include "tandem/error.h"

using tandem::bench::Algorithm;
using tandem::bench::allreduce_seconds;
using tandem::bench::calibrate_overlap;
using tandem::bench::fit_link;
using tandem::bench::Link;
using tandem::bench::parse_link;
using tandem::bench::parse_shape;
using tandem::bench::predict;
using tandem::bench::StepProfile;
using tandem::bench::SweepPoint;

namespace {

Link link(double alpha_us, double busbw_GBps) { return Link{"test", alpha_us * 1e-6, busbw_GBps * 1e9}; }

// A link nothing may use: any all-reduce over it with more than one rank throws.
const Link kUnusable{"unusable", 0, 0};

#define EXPECT_CLOSE(actual, expected) EXPECT_NEAR((actual), (expected), 1e-12 * std::fabs(expected) + 1e-18)
#define EXPECT_FIT(actual, expected) EXPECT_NEAR((actual), (expected), 1e-9 * std::fabs(expected))

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tandem::Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(AllreduceSeconds, RingTwoRanks) {
  // 2 ranks, 1 MB, alpha 10 us, busbw 1 GB/s: 2*1*10us + 1e6/1e9 * 2*1/2 = 20us + 1ms = 1.02 ms.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Ring, 1'000'000, 2, link(10, 1)), 1.02e-3);
}

TEST(AllreduceSeconds, RingFourRanks) {
  // 4 ranks, 1 MB, alpha 10 us, busbw 1 GB/s: 2*3*10us + 1e6/1e9 * 2*3/4 = 60us + 1.5ms = 1.56 ms.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Ring, 1'000'000, 4, link(10, 1)), 1.56e-3);
}

TEST(AllreduceSeconds, TreeEightRanks) {
  // 8 ranks, 8 MB, alpha 10 us, busbw 2 GB/s.
  // Tree: 2*log2(8)*10us + 8e6/2e9 * 2*7/8 = 60us + 4ms*1.75 = 60us + 7ms = 7.06 ms.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Tree, 8'000'000, 8, link(10, 2)), 7.06e-3);
  // Ring, same bandwidth term, 2*7 = 14 steps: 140us + 7ms = 7.14 ms.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Ring, 8'000'000, 8, link(10, 2)), 7.14e-3);
}

TEST(AllreduceSeconds, TreeRoundsStepsUpAtNonPowersOfTwo) {
  // 5 ranks, 1 MB, alpha 10 us, busbw 1 GB/s: ceil(log2 5) = 3, 2*3*10us + 1ms * 2*4/5 = 60us + 1.6ms = 1.66 ms.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Tree, 1'000'000, 5, link(10, 1)), 1.66e-3);
  // 2 ranks: ceil(log2 2) = 1, 2*1*10us + 1ms * 2*1/2 = 1.02 ms, the same as the ring.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Tree, 1'000'000, 2, link(10, 1)), 1.02e-3);
}

TEST(AllreduceSeconds, OneRankIsFreeAndNeedsNoLink) {
  EXPECT_EQ(allreduce_seconds(Algorithm::Ring, 1'000'000, 1, kUnusable), 0.0);
  EXPECT_EQ(allreduce_seconds(Algorithm::Tree, 1'000'000, 1, kUnusable), 0.0);
  EXPECT_EQ(allreduce_seconds(Algorithm::Ring, 1'000'000, 1, 1, kUnusable, kUnusable), 0.0);
}

TEST(AllreduceSeconds, ZeroBytesCostOnlyLatency) {
  // 4 ranks, 0 bytes, alpha 10 us: ring 2*3*10us = 60us; tree 2*2*10us = 40us.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Ring, 0, 4, link(10, 1)), 60e-6);
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Tree, 0, 4, link(10, 1)), 40e-6);
}

TEST(AllreduceSeconds, RejectsBadInput) {
  EXPECT_NE(error_of([] { allreduce_seconds(Algorithm::Ring, 1000, 0, link(1, 1)); }).find("ranks"), std::string::npos);
  EXPECT_NE(error_of([] { allreduce_seconds(Algorithm::Ring, -1, 2, link(1, 1)); }).find("bytes"), std::string::npos);
  EXPECT_NE(error_of([] { allreduce_seconds(Algorithm::Ring, 1000, 2, kUnusable); }).find("bus bandwidth"),
            std::string::npos);
  EXPECT_NE(error_of([] { allreduce_seconds(Algorithm::Ring, 1000, 2, link(-1, 1)); }).find("alpha"),
            std::string::npos);
}

TEST(Hierarchical, FourByTwoIsIntraRingPlusInterAllreduceOfTheShard) {
  // 4 devices x 2 nodes, 8 MB; intra alpha 2 us busbw 100 GB/s, inter alpha 10 us busbw 5 GB/s.
  // Intra ring over 4: 2*3*2us + 8e6/1e11 * 2*3/4 = 12us + 80us*1.5 = 12us + 120us = 132us.
  // Inter ring over 2 of the 8e6/4 = 2e6 shard: 2*1*10us + 2e6/5e9 * 2*1/2 = 20us + 400us = 420us.
  // Total 552us.
  const Link intra = link(2, 100), inter = link(10, 5);
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Ring, 8'000'000, 4, 2, intra, inter), 552e-6);
  // Tree between 2 nodes: ceil(log2 2) = 1 step each way, the same 20us: 552us again.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Tree, 8'000'000, 4, 2, intra, inter), 552e-6);
}

TEST(Hierarchical, EightByFourTreeVersusRingBetweenNodes) {
  // 8 devices x 4 nodes, 8 MB; intra alpha 2 us busbw 100 GB/s, inter alpha 10 us busbw 5 GB/s.
  // Intra ring over 8: 2*7*2us + 80us * 2*7/8 = 28us + 140us = 168us.
  // Shard 8e6/8 = 1e6 between 4 nodes, bandwidth term 1e6/5e9 * 2*3/4 = 200us*1.5 = 300us;
  // tree 2*2*10us = 40us -> 340us; ring 2*3*10us = 60us -> 360us.
  const Link intra = link(2, 100), inter = link(10, 5);
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Tree, 8'000'000, 8, 4, intra, inter), 168e-6 + 340e-6);
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Ring, 8'000'000, 8, 4, intra, inter), 168e-6 + 360e-6);
}

TEST(Hierarchical, OneNodeIsTheIntraAllreduceAlone) {
  // 4x1, 8 MB on intra alpha 2 us busbw 100 GB/s: 132us as above; the inter link is never used.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Ring, 8'000'000, 4, 1, link(2, 100), kUnusable), 132e-6);
  // The intra stage is a ring whatever the algorithm between nodes: still 132us (a tree would be 2*2*2us + 120us).
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Tree, 8'000'000, 4, 1, link(2, 100), kUnusable), 132e-6);
}

TEST(Hierarchical, OneDevicePerNodeIsTheInterAllreduceOfEverything) {
  // 1x2, 8 MB on inter alpha 10 us busbw 5 GB/s: 2*1*10us + 8e6/5e9 * 2*1/2 = 20us + 1.6ms = 1.62 ms.
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Ring, 8'000'000, 1, 2, kUnusable, link(10, 5)), 1.62e-3);
}

TEST(Hierarchical, ShardIsNotRoundedToWholeBytes) {
  // 3x2, 1 MB, both links alpha 0 busbw 1 GB/s.
  // Intra ring over 3: 1ms * 2*2/3 = 4/3 ms. Inter ring over 2 of 1e6/3 bytes: (1/3 ms) * 2*1/2 = 1/3 ms.
  // Total 5/3 ms (a shard truncated to 333333 bytes would give 1.666666333 ms).
  EXPECT_CLOSE(allreduce_seconds(Algorithm::Ring, 1'000'000, 3, 2, link(0, 1), link(0, 1)), 5e-3 / 3);
}

TEST(FitLink, RecoversTwoRankRing) {
  // Ring at 2 ranks, alpha 10 us, busbw 1 GB/s: seconds = 2*1*10us + bytes/1e9 * 2*1/2 = 20us + bytes*1ns.
  const std::vector<SweepPoint> sweep = {
      {1'000, 21e-6},          // 20us + 1us
      {100'000, 120e-6},       // 20us + 100us
      {1'000'000, 1.02e-3},    // 20us + 1ms
      {10'000'000, 10.02e-3},  // 20us + 10ms
  };
  const Link fitted = fit_link(sweep, 2);
  EXPECT_EQ(fitted.name, "measured");
  EXPECT_FIT(fitted.alpha_s, 10e-6);
  EXPECT_FIT(fitted.busbw_Bps, 1e9);
}

TEST(FitLink, RecoversFourRankRing) {
  // Ring at 4 ranks, alpha 5 us, busbw 12 GB/s: intercept 2*3*5us = 30us; slope 2*3/4 / 12e9 = 0.125 ns/byte.
  const std::vector<SweepPoint> sweep = {
      {0, 30e-6},              // 30us
      {4'000'000, 530e-6},     // 30us + 4e6*0.125ns = 30us + 500us
      {8'000'000, 1.03e-3},    // 30us + 1ms
      {80'000'000, 10.03e-3},  // 30us + 10ms
  };
  const Link fitted = fit_link(sweep, 4);
  EXPECT_FIT(fitted.alpha_s, 5e-6);
  EXPECT_FIT(fitted.busbw_Bps, 12e9);
}

TEST(FitLink, RelativeErrorLeastSquaresOfNoisyPoints) {
  // 2 ranks; points (0, 1ms), (1e6, 1ms), (2e6, 3ms), (3e6, 3ms), weighted by 1/t^2, i.e. in the
  // ratio 9 : 9 : 1 : 1. W = 20; Sx = 9e6 + 2e6 + 3e6 = 14e6; Sy = (9 + 9 + 3 + 3) ms = 24 ms;
  // Sxx = 9e12 + 4e12 + 9e12 = 22e12; Sxy = 9e6*1ms + 2e6*3ms + 3e6*3ms = 24e3.
  // slope = (W Sxy - Sx Sy) / (W Sxx - Sx^2) = (480e3 - 336e3) / (440e12 - 196e12) = 36/61 ns/byte;
  // intercept = (Sy - slope Sx) / W = (24 - 504/61) ms / 20 = 48/61 ms.
  // alpha = (48/61 ms) / (2*1) = 24/61 ms; busbw = (2*1/2) / (36/61 ns) = 61/36 GB/s.
  // (Unweighted, the two slow points would pull the slope to 0.8 ns/byte and alpha to 400 us.)
  const Link fitted = fit_link({{0, 1e-3}, {1'000'000, 1e-3}, {2'000'000, 3e-3}, {3'000'000, 3e-3}}, 2);
  EXPECT_FIT(fitted.alpha_s, 24.0 / 61 * 1e-3);
  EXPECT_FIT(fitted.busbw_Bps, 61.0 / 36 * 1e9);
}

TEST(FitLink, NegativeInterceptClampsAlphaToZero) {
  // (1e6, 0.9ms), (2e6, 1.9ms): slope 1 ns/byte, intercept 0.9ms - 1ms = -0.1ms -> alpha 0; busbw (2*1/2)/1e-9 = 1 GB/s.
  const Link fitted = fit_link({{1'000'000, 0.9e-3}, {2'000'000, 1.9e-3}}, 2);
  EXPECT_EQ(fitted.alpha_s, 0.0);
  EXPECT_FIT(fitted.busbw_Bps, 1e9);
}

TEST(FitLink, Errors) {
  EXPECT_NE(error_of([] { fit_link({{1000, 1e-3}, {2000, 2e-3}}, 1); }).find("ranks"), std::string::npos);
  EXPECT_NE(error_of([] { fit_link({}, 2); }).find("empty"), std::string::npos);
  // Two measurements at one size.
  EXPECT_NE(error_of([] { fit_link({{1000, 1e-3}, {1000, 2e-3}}, 2); }).find("distinct sizes"), std::string::npos);
  EXPECT_NE(error_of([] { fit_link({{1000, 1e-3}}, 2); }).find("distinct sizes"), std::string::npos);
  // Flat: time does not grow with size (slope 0).
  EXPECT_NE(error_of([] { fit_link({{1000, 1e-3}, {1'000'000, 1e-3}}, 2); }).find("no bandwidth"), std::string::npos);
  // Falling: slope (1e-3 - 2e-3)/(1e6 - 1e3) < 0.
  EXPECT_NE(error_of([] { fit_link({{1000, 2e-3}, {1'000'000, 1e-3}}, 2); }).find("no bandwidth"), std::string::npos);
  EXPECT_NE(error_of([] { fit_link({{1000, -1e-3}, {2000, 2e-3}}, 2); }).find("finite time"), std::string::npos);
  EXPECT_NE(error_of([] { fit_link({{1000, std::nan("")}, {2000, 2e-3}}, 2); }).find("finite time"),
            std::string::npos);
  EXPECT_NE(error_of([] { fit_link({{-1, 1e-3}, {2000, 2e-3}}, 2); }).find("bytes"), std::string::npos);
}

namespace {

// compute 100 ms, backward 60 ms, buckets 25 MB, 25 MB, 10 MB (the last one last).
// At 2x1 on alpha 10 us, busbw 1 GB/s, each ring all-reduce is 2*1*10us + bytes/1e9 * 2*1/2 = 20us + bytes*1ns:
// 25.02 ms, 25.02 ms, 10.02 ms; comm = 60.06 ms, last = 10.02 ms.
StepProfile profile(double overlap) {
  StepProfile p;
  p.compute_s = 0.100;
  p.backward_s = 0.060;
  p.bucket_bytes = {25'000'000, 25'000'000, 10'000'000};
  p.overlap = overlap;
  return p;
}

}  // namespace

TEST(Predict, LastBucketBoundsTheExposedTime) {
  // overlap 1: comm - 1*60ms = 0.06ms < last 10.02ms, so exposed = 10.02 ms; step 110.02 ms.
  const auto p = predict(profile(1.0), 2, 1, link(10, 1), kUnusable);
  EXPECT_EQ(p.devices_per_node, 2);
  EXPECT_EQ(p.nodes, 1);
  EXPECT_CLOSE(p.comm_s, 60.06e-3);
  EXPECT_CLOSE(p.exposed_comm_s, 10.02e-3);
  EXPECT_CLOSE(p.step_s, 110.02e-3);
  EXPECT_CLOSE(p.efficiency, 100.0 / 110.02);
}

TEST(Predict, OverlapBranch) {
  // overlap 0.5: comm - 0.5*60ms = 60.06 - 30 = 30.06 ms > last 10.02 ms; step 130.06 ms.
  const auto p = predict(profile(0.5), 2, 1, link(10, 1), kUnusable);
  EXPECT_CLOSE(p.exposed_comm_s, 30.06e-3);
  EXPECT_CLOSE(p.step_s, 130.06e-3);
  EXPECT_CLOSE(p.efficiency, 100.0 / 130.06);
  // overlap 0: nothing hides, exposed = comm = 60.06 ms; step 160.06 ms.
  const auto none = predict(profile(0.0), 2, 1, link(10, 1), kUnusable);
  EXPECT_CLOSE(none.exposed_comm_s, 60.06e-3);
  EXPECT_CLOSE(none.step_s, 160.06e-3);
}

TEST(Predict, OneDeviceHasNoCommunication) {
  const auto p = predict(profile(0.5), 1, 1, kUnusable, kUnusable);
  EXPECT_EQ(p.comm_s, 0.0);
  EXPECT_EQ(p.exposed_comm_s, 0.0);
  EXPECT_EQ(p.step_s, 0.100);
  EXPECT_EQ(p.efficiency, 1.0);
}

TEST(Predict, NoBuckets) {
  StepProfile p = profile(1.0);
  p.bucket_bytes.clear();
  const auto prediction = predict(p, 8, 4, link(10, 1), link(10, 1));
  EXPECT_EQ(prediction.exposed_comm_s, 0.0);
  EXPECT_EQ(prediction.efficiency, 1.0);
}

TEST(Predict, HierarchicalBuckets) {
  // 4x2, one 8 MB bucket, intra alpha 2 us busbw 100 GB/s, inter alpha 10 us busbw 5 GB/s: 552us (see
  // Hierarchical.FourByTwo...). It is the last bucket, so exposed = 552us whatever the overlap;
  // compute 100 ms -> step 100.552 ms.
  StepProfile p = profile(1.0);
  p.bucket_bytes = {8'000'000};
  const auto prediction = predict(p, 4, 2, link(2, 100), link(10, 5));
  EXPECT_CLOSE(prediction.comm_s, 552e-6);
  EXPECT_CLOSE(prediction.step_s, 100.552e-3);
}

TEST(Predict, RejectsBadProfiles) {
  StepProfile p = profile(1.0);
  p.compute_s = 0;
  EXPECT_NE(error_of([&] { predict(p, 2, 1, link(10, 1), kUnusable); }).find("compute"), std::string::npos);
  p = profile(1.5);
  EXPECT_NE(error_of([&] { predict(p, 2, 1, link(10, 1), kUnusable); }).find("overlap"), std::string::npos);
  p = profile(1.0);
  p.backward_s = -1;
  EXPECT_NE(error_of([&] { predict(p, 2, 1, link(10, 1), kUnusable); }).find("backward"), std::string::npos);
  p = profile(1.0);
  p.bucket_bytes.push_back(-5);
  EXPECT_NE(error_of([&] { predict(p, 2, 1, link(10, 1), kUnusable); }).find("bucket"), std::string::npos);
  EXPECT_NE(error_of([&] { predict(profile(1.0), 0, 1, link(10, 1), kUnusable); }).find("devices per node"),
            std::string::npos);
  EXPECT_NE(error_of([&] { predict(profile(1.0), 2, 0, link(10, 1), kUnusable); }).find("nodes"),
            std::string::npos);
  // The shape is checked even when there is nothing to all-reduce.
  p = profile(1.0);
  p.bucket_bytes.clear();
  EXPECT_NE(error_of([&] { predict(p, 0, 1, link(10, 1), kUnusable); }).find("devices per node"), std::string::npos);
}

TEST(CalibrateOverlap, RoundTrip) {
  // Measured step 125 ms at 2x1: exposed 25 ms. overlap = (comm - exposed)/backward = (60.06 - 25)/60 = 35.06/60.
  const double overlap = calibrate_overlap(profile(1.0), 0.125, 2, 1, link(10, 1), kUnusable);
  EXPECT_CLOSE(overlap, 35.06 / 60);
  // predict with it: exposed = max(10.02, 60.06 - 35.06) = 25 ms, step 125 ms, the measurement.
  const auto p = predict(profile(overlap), 2, 1, link(10, 1), kUnusable);
  EXPECT_CLOSE(p.step_s, 0.125);
}

TEST(CalibrateOverlap, Clamps) {
  // Step = compute (nothing exposed): (60.06 - 0)/60 > 1 -> 1.
  EXPECT_EQ(calibrate_overlap(profile(1.0), 0.100, 2, 1, link(10, 1), kUnusable), 1.0);
  // Step 200 ms, exposed 100 ms > comm 60.06 ms: (60.06 - 100)/60 < 0 -> 0.
  EXPECT_EQ(calibrate_overlap(profile(1.0), 0.200, 2, 1, link(10, 1), kUnusable), 0.0);
  // No backward: nothing to hide behind -> 0.
  StepProfile p = profile(1.0);
  p.backward_s = 0;
  EXPECT_EQ(calibrate_overlap(p, 0.125, 2, 1, link(10, 1), kUnusable), 0.0);
  EXPECT_NE(error_of([] { calibrate_overlap(profile(1.0), 0, 2, 1, link(10, 1), kUnusable); }).find("measured step"),
            std::string::npos);
}

TEST(ParseLink, Presets) {
  // nvlink: 3 us, 370 GB/s.
  Link l = parse_link("nvlink");
  EXPECT_EQ(l.name, "nvlink");
  EXPECT_CLOSE(l.alpha_s, 3e-6);
  EXPECT_CLOSE(l.busbw_Bps, 370e9);
  // ib100: 5 us, 12 GB/s (line rate 100 Gb/s / 8 = 12.5 GB/s).
  l = parse_link("ib100");
  EXPECT_CLOSE(l.alpha_s, 5e-6);
  EXPECT_CLOSE(l.busbw_Bps, 12e9);
  EXPECT_LE(l.busbw_Bps, 100e9 / 8);
  // ib400: 5 us, 48 GB/s (line rate 50 GB/s).
  l = parse_link("ib400");
  EXPECT_CLOSE(l.alpha_s, 5e-6);
  EXPECT_CLOSE(l.busbw_Bps, 48e9);
  EXPECT_LE(l.busbw_Bps, 400e9 / 8);
  // eth10: 25 us, 1.17 GB/s (line rate 1.25 GB/s).
  l = parse_link("eth10");
  EXPECT_CLOSE(l.alpha_s, 25e-6);
  EXPECT_CLOSE(l.busbw_Bps, 1.17e9);
  EXPECT_LE(l.busbw_Bps, 10e9 / 8);
  // eth100: 25 us, 11.7 GB/s (line rate 12.5 GB/s).
  l = parse_link("eth100");
  EXPECT_CLOSE(l.alpha_s, 25e-6);
  EXPECT_CLOSE(l.busbw_Bps, 11.7e9);
  EXPECT_LE(l.busbw_Bps, 100e9 / 8);
}

TEST(ParseLink, Custom) {
  // "5:12.5": alpha 5 us, busbw 12.5 GB/s.
  Link l = parse_link("5:12.5");
  EXPECT_EQ(l.name, "5:12.5");
  EXPECT_CLOSE(l.alpha_s, 5e-6);
  EXPECT_CLOSE(l.busbw_Bps, 12.5e9);
  l = parse_link("0:0.5");
  EXPECT_EQ(l.alpha_s, 0.0);
  EXPECT_CLOSE(l.busbw_Bps, 0.5e9);
  l = parse_link(".5:1e3");
  EXPECT_CLOSE(l.alpha_s, 0.5e-6);
  EXPECT_CLOSE(l.busbw_Bps, 1e12);
}

TEST(ParseLink, RejectsJunkInOneLine) {
  for (const char* junk : {"", "nvl", "NVLINK", "ib", "5", "5:", ":12", "5:0", "-1:12", "5:-3", "a:b", "5:12:3",
                           " 5:12", "5:12 ", "inf:1", "5:nan", "5us:12"}) {
    const std::string message = error_of([&] { parse_link(junk); });
    EXPECT_NE(message.find("ALPHA_US:BUSBW_GBPS"), std::string::npos) << junk << ": " << message;
    EXPECT_NE(message.find("nvlink, ib100, ib400, eth10, eth100"), std::string::npos) << message;
    EXPECT_NE(message.find(std::string("'") + junk + "'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(ParseShape, Forms) {
  EXPECT_EQ(parse_shape("4x2"), std::make_pair(4, 2));
  EXPECT_EQ(parse_shape("8"), std::make_pair(8, 1));
  EXPECT_EQ(parse_shape("1x1"), std::make_pair(1, 1));
  EXPECT_EQ(parse_shape("8x128"), std::make_pair(8, 128));
}

TEST(ParseShape, RejectsJunkInOneLine) {
  for (const char* junk : {"", "0", "0x2", "4x0", "-1", "4x-2", "x2", "4x", "x", "4x2x1", "4X2", "a", " 4x2",
                           "4x2 ", "4.5", "+4", "1234567", "4*2"}) {
    const std::string message = error_of([&] { parse_shape(junk); });
    EXPECT_NE(message.find("DEVICESxNODES"), std::string::npos) << junk << ": " << message;
    EXPECT_NE(message.find(std::string("'") + junk + "'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}
