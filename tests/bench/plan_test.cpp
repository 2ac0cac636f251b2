// What `tandem bench` runs, in which order, and its flag checks.
#include <gtest/gtest.h>

#include <algorithm>

#include "bench/plan.h"
#include "tandem/error.h"

namespace tandem::bench {
namespace {

// `m` without a backend: its default (Gloo for a multi-process strategy, none otherwise).
bool contains(const std::vector<Measurement>& ms, Measurement m) {
  if (m.backend.empty()) m.backend = normal_backend(m.strategy, "");
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

TEST(Plan, AtWorldOneMeasuresEachStrategyOnOneDeviceWithoutItsSupport) {
  BenchConfig config;
  config.models = {"small"};
  config.strategies = {"ddp"};
  config.worlds = {1};
  EXPECT_EQ(measurements(config, /*with_peers=*/true).size(), 2u);  // the baseline alone, by default
  config.at_world_one = true;
  const auto ms = measurements(config, /*with_peers=*/true);
  for (const char* impl : {"tandem", "pytorch"}) {
    EXPECT_TRUE(contains(ms, {impl, "small", "single", 1})) << impl;
    EXPECT_TRUE(contains(ms, {impl, "small", "ddp", 1})) << impl;
  }
  EXPECT_EQ(ms.size(), 4u);  // no no-sync or all-reduce runs on one device
  config.worlds = {1, 2};
  EXPECT_TRUE(contains(measurements(config, true), {"tandem", "small", "allreduce", 2}));
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

TEST(Plan, TandemsMultiProcessRunsOncePerBackendPeersOnGlooOnly) {
  BenchConfig config;
  config.models = {"small"};
  config.strategies = {"single", "dp-persistent", "ddp"};
  config.worlds = {1, 2};
  config.backends = {"gloo", "mpi"};
  const auto ms = measurements(config, /*with_peers=*/true);
  for (const char* backend : {"gloo", "mpi"}) {
    for (const char* strategy : {"ddp", "ddp-no-sync", "allreduce"}) {
      EXPECT_TRUE(contains(ms, {"tandem", "small", strategy, 2, backend})) << strategy << " " << backend;
    }
  }
  EXPECT_TRUE(contains(ms, {"pytorch", "small", "ddp", 2, "gloo"}));
  EXPECT_FALSE(contains(ms, {"pytorch", "small", "ddp", 2, "mpi"}));  // PyTorch's wheel has no MPI
  // One process talks to no backend: measured once, with none.
  EXPECT_TRUE(contains(ms, {"tandem", "small", "single", 1, ""}));
  EXPECT_TRUE(contains(ms, {"tandem", "small", "dp-persistent", 2, ""}));
  EXPECT_EQ(std::count_if(ms.begin(), ms.end(), [](const Measurement& m) { return m.strategy == "dp-persistent"; }), 1);
  // tandem: single, dp-persistent, 3 x 2 backends; pytorch: single, dp, ddp, ddp-no-sync.
  EXPECT_EQ(ms.size(), 2u + 6 + 4);

  // MPI alone: no Gloo run of Tandem's, the peers still on Gloo.
  config.backends = {"mpi"};
  const auto only = measurements(config, true);
  EXPECT_FALSE(contains(only, {"tandem", "small", "ddp", 2, "gloo"}));
  EXPECT_TRUE(contains(only, {"tandem", "small", "ddp", 2, "mpi"}));
  EXPECT_TRUE(contains(only, {"pytorch", "small", "ddp", 2, "gloo"}));
}

TEST(Plan, TheSweepRunsOnEveryBackendAndWithSweepAtEveryWorld) {
  BenchConfig config;
  config.models = {"small"};
  config.strategies = {"ddp"};
  config.worlds = {1, 2, 4};
  config.backends = {"gloo", "mpi"};
  config.repeats = 1;
  config.project = {"8x1"};  // the projection's sweep: the calibration world, each backend
  auto p = plan(config, false);
  ASSERT_GE(p.size(), 2u);
  EXPECT_EQ(p[0].measurement, (Measurement{"tandem", "small", "sweep", 2, "gloo"}));
  EXPECT_EQ(p[1].measurement, (Measurement{"tandem", "small", "sweep", 2, "mpi"}));
  EXPECT_NE(p[2].measurement.strategy, "sweep");
  config.project.clear();
  config.sweep = true;  // --sweep: every world above one
  p = plan(config, false);
  std::vector<Measurement> sweeps;
  for (const auto& planned : p) {
    if (planned.measurement.strategy == "sweep") {
      EXPECT_EQ(planned.repeat, -1);
      sweeps.push_back(planned.measurement);
    }
  }
  EXPECT_EQ(sweeps, (std::vector<Measurement>{{"tandem", "small", "sweep", 2, "gloo"},
                                              {"tandem", "small", "sweep", 2, "mpi"},
                                              {"tandem", "small", "sweep", 4, "gloo"},
                                              {"tandem", "small", "sweep", 4, "mpi"}}));
}

TEST(Plan, BackendsAndSweepSizesAreChecked) {
  auto message_of = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(parse_backends("mpi,gloo,mpi", "cpu", true), (std::vector<std::string>{"mpi", "gloo"}));
  EXPECT_EQ(parse_backends("gloo", "cuda", false), (std::vector<std::string>{"gloo"}));
  EXPECT_EQ(message_of([] { parse_backends("gloo,nccl", "cpu", true); }),
            "--backends: unknown value 'nccl' (expected a comma-separated list of gloo, mpi)");
  EXPECT_NE(message_of([] { parse_backends("gloo,mpi", "cpu", false); }).find("this build of Tandem has no MPI backend"),
            std::string::npos);
  EXPECT_NE(message_of([] { parse_backends("mpi", "cuda", true); }).find("run on NCCL"), std::string::npos);
  EXPECT_EQ(message_of([] { check_sweep_sizes(65536, int64_t{64} << 20); }), "no error");  // 64 KiB .. 64 MiB
  EXPECT_NE(message_of([] { check_sweep_sizes(6, 4096); }).find("--sweep-min-bytes"), std::string::npos);
  EXPECT_NE(message_of([] { check_sweep_sizes(8192, 4096); }).find("--sweep-max-bytes"), std::string::npos);
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
  // A group name stands for its members, in the table's order, once each.
  EXPECT_EQ(parse_strategies("ddp,pp,pp-1f1b"), (std::vector<std::string>{"ddp", "pp-gpipe", "pp-1f1b", "pp-interleaved"}));
  EXPECT_NE(message_of([] { parse_strategies("ddp,pipeline"); }).find("unknown value 'pipeline' (expected"),
            std::string::npos);
  EXPECT_NE(message_of([] { parse_strategies("ddp,pipeline"); }).find(", pp)"), std::string::npos);
  for (const char* bad : {"0", "two", "2,", "1.5", "-1", "2000"}) {
    EXPECT_NE(message_of([&] { parse_worlds(bad); }).find("--nproc"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace tandem::bench
