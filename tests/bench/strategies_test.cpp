// The strategy table's own rules (strategies.h): what the plan, the analysis and the workers rely on.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "bench/strategies.h"
#include "tandem/error.h"

namespace tandem::bench {
namespace {

TEST(Strategies, NamesAreUniqueAndEveryReferenceResolves) {
  std::set<std::string> names;
  for (const auto& s : strategies()) {
    EXPECT_TRUE(names.insert(s.name).second) << "twice: " << s.name;
    EXPECT_FALSE(s.label.empty() || s.peer_label.empty() || s.what.empty() || s.summary.empty()) << s.name;
    if (!s.peer.empty()) {
      EXPECT_TRUE(lookup_strategy(s.peer).pytorch) << s.name << "'s peer " << s.peer;
    }
    if (!s.comm.empty()) {
      // DDP's figures: a synced step, its no_sync twin (a step without communication, above one
      // device) and an all-reduce of the gradient.
      EXPECT_EQ(lookup_strategy(s.comm.synced).timing, Timing::Step) << s.name;
      EXPECT_EQ(lookup_strategy(s.comm.no_sync).worlds, Worlds::AboveOne) << s.name;
      EXPECT_EQ(lookup_strategy(s.comm.allreduce).timing, Timing::GradientAllReduce) << s.name;
    }
    // Backends are those of a process group's collectives: ranks only.
    EXPECT_EQ(s.backends.empty(), s.launch != Launch::Ranks) << s.name;
    EXPECT_TRUE(s.tandem || s.pytorch) << s.name << ": a strategy neither worker measures";
  }
  EXPECT_THROW(lookup_strategy("ddp-typo"), Error);
  EXPECT_EQ(find_strategy("ddp-typo"), nullptr);
}

TEST(Strategies, OneBaselineOneSweepAndTheUserListInTableOrder) {
  EXPECT_EQ(strategy_names({Role::Baseline}), std::vector<std::string>{"single"});
  EXPECT_EQ(baseline().name, "single");
  EXPECT_EQ(baseline().worlds, Worlds::One);
  EXPECT_EQ(strategy_names({Role::Link}), std::vector<std::string>{"sweep"});
  EXPECT_EQ(link_sweep().timing, Timing::Sweep);
  // --strategies' values and default: the baseline first, then every compared strategy, in the
  // table's order (the table lists them before the peer-only and supporting entries).
  const auto user = user_strategies();
  ASSERT_FALSE(user.empty());
  EXPECT_EQ(user.front(), "single");
  for (size_t i = 0; i < user.size(); ++i) {
    EXPECT_EQ(strategies()[i].name, user[i]);
    EXPECT_EQ(strategies()[i].role, i == 0 ? Role::Baseline : Role::Compared) << user[i];
  }
  for (const char* name : {"dp-replicate", "dp-persistent", "ddp", "accelerate"}) {
    EXPECT_NE(std::find(user.begin(), user.end(), name), user.end()) << name;
  }
  // The default run: the classic five (every report before ZeRO compared these).
  EXPECT_EQ(default_strategies(), (std::vector<std::string>{"single", "dp-replicate", "dp-persistent", "ddp", "accelerate"}));
  EXPECT_EQ(strategy_names({}).size(), strategies().size());
}

TEST(Strategies, BackendsAreThoseOfProcessGroups) {
  EXPECT_TRUE(multi_process("ddp"));
  EXPECT_FALSE(multi_process("single"));
  EXPECT_FALSE(multi_process("dp-persistent"));
  EXPECT_FALSE(multi_process("dp"));
  EXPECT_TRUE(multi_process("zero9"));  // a newer Tandem's strategy keeps the backend its record names
  EXPECT_EQ(normal_backend("ddp", ""), "gloo");  // records from before --backends
  EXPECT_EQ(normal_backend("ddp", "mpi"), "mpi");
  EXPECT_EQ(normal_backend("dp-replicate", "gloo"), "");
}

}  // namespace
}  // namespace tandem::bench
