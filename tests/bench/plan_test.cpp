// What `tandem bench` runs, in which order, and its flag checks.
#include <gtest/gtest.h>

#include <algorithm>

#include "bench/plan.h"
#include "tandem/error.h"

namespace tandem::bench {
namespace {

bool contains(const std::vector<Measurement>& ms, const Measurement& m) {
  return std::find(ms.begin(), ms.end(), m) != ms.end();
}

TEST(Plan, EachStrategyWithItsBaselineSupportAndPeer) {
  BenchConfig config;
  config.models = {"small"};
  config.strategies = {"ddp", "dp-persistent"};
  config.worlds = {1, 2, 4};
  const auto ms = measurements(config, /*with_peers=*/true);
  EXPECT_TRUE(contains(ms, {"tandem", "small", "single", 1}));  // always: every ratio divides by it
  EXPECT_TRUE(contains(ms, {"pytorch", "small", "single", 1}));
  for (int w : {2, 4}) {
    EXPECT_TRUE(contains(ms, {"tandem", "small", "ddp", w}));
    EXPECT_TRUE(contains(ms, {"tandem", "small", "ddp-no-sync", w}));
    EXPECT_TRUE(contains(ms, {"tandem", "small", "allreduce", w}));
    EXPECT_TRUE(contains(ms, {"pytorch", "small", "ddp", w}));
    EXPECT_TRUE(contains(ms, {"pytorch", "small", "ddp-no-sync", w}));
    EXPECT_TRUE(contains(ms, {"tandem", "small", "dp-persistent", w}));
    EXPECT_TRUE(contains(ms, {"pytorch", "small", "dp", w}));
  }
  EXPECT_FALSE(contains(ms, {"tandem", "small", "ddp", 1}));  // a wrapper over one device is not a strategy
  EXPECT_EQ(ms.size(), 2u + 2 * 7);
  const auto alone = measurements(config, /*with_peers=*/false);
  EXPECT_TRUE(std::none_of(alone.begin(), alone.end(), [](const Measurement& m) { return m.impl == "pytorch"; }));
}

TEST(Plan, TheAcceleratorBringsTheDdpRunsItsFiguresComeFrom) {
  BenchConfig config;
  config.models = {"small"};
  config.strategies = {"accelerate"};
  config.worlds = {1, 2};
  const auto ms = measurements(config, /*with_peers=*/true);
  for (const char* strategy : {"accelerate", "ddp", "ddp-no-sync"}) {
    EXPECT_TRUE(contains(ms, {"tandem", "small", strategy, 2})) << strategy;
    EXPECT_TRUE(contains(ms, {"pytorch", "small", strategy, 2})) << strategy;
  }
  EXPECT_TRUE(contains(ms, {"tandem", "small", "allreduce", 2}));
}

TEST(Plan, RepeatsAlternateTheirOrderAndTheSweepComesOnce) {
  BenchConfig config;
  config.models = {"small", "large"};
  config.strategies = {"ddp"};
  config.worlds = {1, 2};
  config.repeats = 3;
  const auto each = measurements(config, false);
  auto p = plan(config, false);
  ASSERT_EQ(p.size(), 3 * each.size());
  for (size_t i = 0; i < each.size(); ++i) {
    EXPECT_EQ(p[i].measurement, each[i]);                                     // repeat 0: in order
    EXPECT_EQ(p[each.size() + i].measurement, each[each.size() - 1 - i]);     // repeat 1: reversed
    EXPECT_EQ(p[2 * each.size() + i].measurement, each[i]);                   // repeat 2: in order
    EXPECT_EQ(p[each.size() + i].repeat, 1);
  }
  config.project = {"8x4"};
  config.worlds = {1, 2, 4};
  p = plan(config, false);
  ASSERT_EQ(p.size(), 3 * measurements(config, false).size() + 1);
  EXPECT_EQ(p.front().measurement.strategy, "sweep");
  EXPECT_EQ(p.front().measurement.world, 2);  // at the calibration world, not the widest
  EXPECT_EQ(p.front().repeat, -1);
}

TEST(Plan, FlagValuesAreChecked) {
  EXPECT_EQ(parse_list("--models", "large,small,large", {"small", "medium", "large"}),
            (std::vector<std::string>{"large", "small"}));
  EXPECT_EQ(parse_worlds("4,1,2"), (std::vector<int>{1, 2, 4}));
  auto message_of = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message_of([] { parse_list("--models", "small,huge", {"small", "medium", "large"}); }),
            "--models: unknown value 'huge' (expected a comma-separated list of small, medium, large)");
  EXPECT_NE(message_of([] { parse_list("--models", "", {"small"}); }).find("--models is empty"), std::string::npos);
  for (const char* bad : {"0", "two", "2,", "1.5", "-1", "2000"}) {
    EXPECT_NE(message_of([&] { parse_worlds(bad); }).find("--nproc"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace tandem::bench
