// The environment contract: a table of good and malformed environments, each with its outcome.
#include <gtest/gtest.h>

#include <map>

#include "tandem/comm/world.h"
#include "tandem/error.h"

using tandem::comm::World;
using tandem::comm::WorldSource;
using Env = std::map<std::string, std::string>;

namespace {

World from(const Env& env) {
  return World::from_lookup([&](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

std::string error_of(const Env& env) {
  try {
    from(env);
  } catch (const tandem::Error& e) {
    return e.what();
  }
  return "<no error>";
}

const Env kTorchrun = {{"RANK", "5"},           {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "1"},     {"LOCAL_WORLD_SIZE", "4"},
                       {"GROUP_RANK", "1"},     {"MASTER_ADDR", "node0"},
                       {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RESTART_COUNT", "2"},
                       {"TORCHELASTIC_MAX_RESTARTS", "3"}, {"TORCHELASTIC_RUN_ID", "job7"}};

Env with(Env env, const std::string& key, const std::optional<std::string>& value) {
  if (value) env[key] = *value; else env.erase(key);
  return env;
}

}  // namespace

TEST(World, NoVariablesIsAWorldOfOne) {
  World w = from({});
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_EQ(w.local_world_size, 1);
  EXPECT_FALSE(w.is_distributed());
  EXPECT_EQ(w.source, WorldSource::Single);
}

TEST(World, ReadsTheTorchrunContract) {
  World w = from(kTorchrun);
  EXPECT_EQ(w.source, WorldSource::Torchrun);
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.group_rank, 1);
  EXPECT_EQ(w.master_addr, "node0");
  EXPECT_EQ(w.master_port, 29500);
  EXPECT_EQ(w.restart_count, 2);
  EXPECT_EQ(w.max_restarts, 3);
  EXPECT_EQ(w.run_id, "job7");
  EXPECT_FALSE(w.single_node());
  EXPECT_EQ(w.device(true).str(), "cuda:1");
  EXPECT_EQ(w.device(false).str(), "cpu");
}

TEST(World, HandStartedRanksWithoutLocalVariablesAreOneHost) {
  World w = from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.group_rank, 0);
  EXPECT_TRUE(w.single_node());
}

TEST(World, FallsBackToSlurm) {
  World w = from({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                  {"SLURM_NTASKS_PER_NODE", "4(x2)"}, {"SLURM_NODEID", "1"},
                  {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29400"}});
  EXPECT_EQ(w.source, WorldSource::Slurm);
  EXPECT_EQ(w.rank, 6);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 2);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.group_rank, 1);
}

TEST(World, FallsBackToOpenMpi) {
  World w = from({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                  {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29400"}});
  EXPECT_EQ(w.source, WorldSource::OpenMpi);
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.group_rank, 1);
}

TEST(World, TorchrunVariablesWinOverSlurm) {
  Env env = kTorchrun;
  env["SLURM_PROCID"] = "0";
  env["SLURM_NTASKS"] = "1";
  EXPECT_EQ(from(env).source, WorldSource::Torchrun);
}

struct BadCase {
  const char* name;
  Env env;
  const char* message;  // the whole one-line message
};

void PrintTo(const BadCase& c, std::ostream* out) { *out << c.name; }

class MalformedEnvironment : public ::testing::TestWithParam<BadCase> {};

TEST_P(MalformedEnvironment, GivesOneLineNamingTheVariable) {
  const auto& c = GetParam();
  const std::string message = error_of(c.env);
  EXPECT_EQ(message, c.message);
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Table, MalformedEnvironment,
    ::testing::Values(
        BadCase{"RankNotInteger", with(kTorchrun, "RANK", "one"),
                "RANK=\"one\" is not valid: expected a non-negative integer (e.g. 0)"},
        BadCase{"RankTrailingGarbage", with(kTorchrun, "RANK", "1x"),
                "RANK=\"1x\" is not valid: expected a non-negative integer (e.g. 0)"},
        BadCase{"RankNegative", with(kTorchrun, "RANK", "-1"),
                "RANK=\"-1\" is not valid: expected a non-negative integer (e.g. 0)"},
        BadCase{"RankEmpty", with(kTorchrun, "RANK", ""),
                "RANK=\"\" is not valid: expected a non-negative integer (e.g. 0)"},
        BadCase{"WorldSizeZero", with(kTorchrun, "WORLD_SIZE", "0"),
                "WORLD_SIZE=\"0\" is not valid: expected a positive integer (e.g. 4)"},
        BadCase{"WorldSizeFloat", with(kTorchrun, "WORLD_SIZE", "2.5"),
                "WORLD_SIZE=\"2.5\" is not valid: expected a positive integer (e.g. 4)"},
        BadCase{"RankAtWorldSize", with(kTorchrun, "RANK", "8"),
                "RANK=8 must be less than the world size 8"},
        BadCase{"LocalRankAtLocalWorldSize", with(kTorchrun, "LOCAL_RANK", "4"),
                "LOCAL_RANK=4 must be less than the local world size 4"},
        BadCase{"LocalWorldSizeAboveWorldSize", with(kTorchrun, "LOCAL_WORLD_SIZE", "9"),
                "LOCAL_WORLD_SIZE=9 must not exceed WORLD_SIZE=8"},
        BadCase{"LocalRankNegative", with(kTorchrun, "LOCAL_RANK", "-2"),
                "LOCAL_RANK=\"-2\" is not valid: expected a non-negative integer (e.g. 0)"},
        BadCase{"RankWithoutWorldSize", {{"RANK", "0"}},
                "RANK is set but WORLD_SIZE is not: set both (e.g. RANK=0 WORLD_SIZE=2)"},
        BadCase{"WorldSizeWithoutRank", {{"WORLD_SIZE", "2"}},
                "WORLD_SIZE is set but RANK is not: set both (e.g. RANK=0 WORLD_SIZE=2)"},
        BadCase{"MissingMasterAddr", with(kTorchrun, "MASTER_ADDR", std::nullopt),
                "MASTER_ADDR is not set: a world of 8 ranks needs the host of rank 0 (e.g. MASTER_ADDR=127.0.0.1)"},
        BadCase{"EmptyMasterAddr", with(kTorchrun, "MASTER_ADDR", ""), "MASTER_ADDR is set but empty"},
        BadCase{"MissingMasterPort", with(kTorchrun, "MASTER_PORT", std::nullopt),
                "MASTER_PORT is not set: a world of 8 ranks needs rank 0's store port (e.g. MASTER_PORT=29500)"},
        BadCase{"PortZero", with(kTorchrun, "MASTER_PORT", "0"),
                "MASTER_PORT=\"0\" is not valid: expected a TCP port number in 1..65535"},
        BadCase{"PortTooLarge", with(kTorchrun, "MASTER_PORT", "65536"),
                "MASTER_PORT=\"65536\" is not valid: expected a TCP port number in 1..65535"},
        BadCase{"PortNotInteger", with(kTorchrun, "MASTER_PORT", "http"),
                "MASTER_PORT=\"http\" is not valid: expected a TCP port number in 1..65535"},
        BadCase{"RestartCountNegative", with(kTorchrun, "TORCHELASTIC_RESTART_COUNT", "-1"),
                "TORCHELASTIC_RESTART_COUNT=\"-1\" is not valid: expected a non-negative integer (e.g. 0)"},
        BadCase{"SlurmRankAtSize", {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}},
                "SLURM_PROCID=4 must be less than the world size 4"},
        BadCase{"MpiSizeNotInteger", {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "x"}},
                "OMPI_COMM_WORLD_SIZE=\"x\" is not valid: expected a positive integer (e.g. 4)"}),
    [](const auto& info) { return std::string(info.param.name); });
