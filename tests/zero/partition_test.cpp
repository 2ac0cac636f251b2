// ZeRO-1's assignment of parameters to ranks against PyTorch's own
// (tests/oracles/zero_partition.json: ZeroRedundancyOptimizer._partition_parameters).
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tandem/error.h"
#include "tandem/zero/partition.h"

TEST(ZeroPartition, MatchesZeroRedundancyOptimizerForEveryCase) {
  std::ifstream in(TANDEM_ORACLES_DIR "/zero_partition.json");
  ASSERT_TRUE(in);
  const auto table = nlohmann::json::parse(in);
  ASSERT_GE(table.at("cases").size(), 30u);
  for (const auto& c : table.at("cases")) {
    const auto numels = c.at("numels").get<std::vector<std::vector<int64_t>>>();
    const int world = c.at("world_size").get<int>();
    EXPECT_EQ(tandem::zero::assign_owners(numels, world), c.at("owner").get<std::vector<std::vector<int>>>())
        << c.at("model").get<std::string>() << " on " << world << " ranks";
  }
}

TEST(ZeroPartition, RefusesAWorldOfNone) { EXPECT_THROW(tandem::zero::assign_owners({{1}}, 0), tandem::Error); }
