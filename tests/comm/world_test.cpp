// The environment contract: a table of good and malformed environments, each with its outcome;
// then the rendezvous it leads to (a launcher's store, a busy port).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "tandem/comm/net.h"
#include "tandem/comm/rendezvous.h"
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

// Found by the environment fuzzer: c10::DeviceIndex is 8 bits, and LOCAL_RANK=150 became cuda:-106.
TEST(World, ALocalRankBeyondLibTorchsDeviceIndicesIsAnErrorForCuda) {
  Env env = with(with(with(kTorchrun, "WORLD_SIZE", "256"), "LOCAL_WORLD_SIZE", "256"), "LOCAL_RANK", "127");
  EXPECT_EQ(from(env).device(true).str(), "cuda:127");
  World w = from(with(env, "LOCAL_RANK", "150"));
  EXPECT_EQ(w.device(false).str(), "cpu");
  try {
    w.device(true);
    ADD_FAILURE() << "no error";
  } catch (const tandem::Error& e) {
    EXPECT_STREQ(e.what(), "the local rank 150 cannot name a CUDA device: LibTorch numbers a host's devices 0 to 127");
  }
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

// Note [Slurm's rank 0]: under srun, rank 0's host and port come from Slurm's own variables.
TEST(World, SlurmDerivesRankZerosHostAndPortFromTheStep) {
  Env step{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"}, {"SLURM_NTASKS_PER_NODE", "2(x2)"},
           {"SLURM_NODEID", "0"}, {"SLURM_STEP_NODELIST", "gpu[07-08]"}, {"SLURM_JOB_NODELIST", "gpu[01-08]"},
           {"SLURM_JOB_ID", "4711"}, {"SLURM_STEP_ID", "3"}};
  World w = from(step);
  EXPECT_EQ(w.master_addr, "gpu07");
  EXPECT_EQ(w.master_port, 15000 + (31 * 4711 + 3) % 17000);
  EXPECT_EQ(from(with(step, "SLURM_STEP_ID", "4")).master_port, w.master_port + 1);  // another step, another port
  // A batch script is no step: its tasks were never started, so nothing is derived (no rank 0 to
  // wait for), and MASTER_ADDR's message says to use srun.
  EXPECT_EQ(from(with(with(step, "SLURM_STEP_NODELIST", std::nullopt), "MASTER_ADDR", "n9")).master_addr, "n9");
  EXPECT_EQ(error_of(with(step, "SLURM_STEP_NODELIST", std::nullopt)).rfind(
                "MASTER_ADDR is not set: a world of 4 ranks (SLURM_NTASKS=4) needs the host of rank 0 (e.g. start the "
                "tasks with srun",
                0),
            0u);
  // One task needs no rank 0: a malformed list or job id does not stop it.
  EXPECT_EQ(from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_NODELIST", "n[1"}, {"SLURM_JOB_ID", "x"}})
                .master_port,
            0);
  EXPECT_EQ(from(with(step, "SLURM_STEP_RESV_PORTS", "12000-12001")).master_port, 12000);
  // MASTER_ADDR and MASTER_PORT, when set, win.
  World set = from(with(with(step, "MASTER_ADDR", "10.0.0.9"), "MASTER_PORT", "29400"));
  EXPECT_EQ(set.master_addr, "10.0.0.9");
  EXPECT_EQ(set.master_port, 29400);
}

// Note [Threads under srun]: one thread per task when several share a node, as tandem run gives.
TEST(World, SlurmTasksGetTheThreadsTandemRunWouldGive) {
  Env two{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "1"}, {"SLURM_STEP_NODELIST", "n1"},
          {"SLURM_JOB_ID", "9"}};
  EXPECT_EQ(from(two).intra_op_threads, 1);
  EXPECT_EQ(from(with(two, "SLURM_CPUS_PER_TASK", "4")).intra_op_threads, 4);
  EXPECT_EQ(from(with(two, "OMP_NUM_THREADS", "3")).intra_op_threads, 0);  // the user's choice stands
  EXPECT_EQ(from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).intra_op_threads, 0);  // alone on its node
  EXPECT_EQ(from(kTorchrun).intra_op_threads, 0);  // the launcher decides
}

TEST(World, SlurmNodeListsGiveTheirFirstHost) {
  for (const auto& [list, host] : std::vector<std::pair<std::string, std::string>>{
           {"tandem1", "tandem1"},
           {"n5,n1", "n5"},
           {"a[08-10]b,c", "a08b"},
           {"rack[1-2]-node[3,5]", "rack1-node3"},
           {"node[5]", "node5"},
           {"node[012,3-4]", "node012"},
           {"host.example.org", "host.example.org"}}) {
    EXPECT_EQ(from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", list}, {"SLURM_JOB_ID", "1"}})
                  .master_addr,
              host)
        << list;
  }
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

TEST(World, ReadsTorchrunsAgentStoreFlag) {
  EXPECT_FALSE(from(kTorchrun).use_agent_store);  // absent: rank 0 hosts the store
  EXPECT_TRUE(from(with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "True")).use_agent_store);
  EXPECT_FALSE(from(with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "False")).use_agent_store);
  EXPECT_NE(from(with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "True")).describe().find(
                "master node0:29500 (agent store)"),
            std::string::npos);
}

TEST(World, SlurmAndOpenMpiWithoutSizesAreAWorldOfOne) {
  World slurm = from({{"SLURM_PROCID", "0"}});
  EXPECT_EQ(slurm.world_size, 1);
  EXPECT_EQ(slurm.local_world_size, 1);
  World mpi = from({{"OMPI_COMM_WORLD_RANK", "0"}});
  EXPECT_EQ(mpi.world_size, 1);
  EXPECT_EQ(mpi.local_world_size, 1);
}

TEST(World, SlurmTaskCountsAcceptEverySlurmSpelling) {
  const Env base = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "8"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "1"}};
  EXPECT_EQ(from(with(base, "SLURM_NTASKS_PER_NODE", "4")).local_world_size, 4);
  EXPECT_EQ(from(with(base, "SLURM_NTASKS_PER_NODE", "4(x2)")).local_world_size, 4);
  EXPECT_EQ(from(with(base, "SLURM_NTASKS_PER_NODE", "4,2(x2)")).local_world_size, 4);
  // Without it: the tasks spread over SLURM_NNODES, rounded up.
  EXPECT_EQ(from(with(base, "SLURM_NNODES", "3")).local_world_size, 3);
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
                "RANK=8 must be less than WORLD_SIZE=8"},
        BadCase{"LocalRankAtLocalWorldSize", with(kTorchrun, "LOCAL_RANK", "4"),
                "LOCAL_RANK=4 must be less than LOCAL_WORLD_SIZE=4"},
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
                "SLURM_PROCID=4 must be less than SLURM_NTASKS=4"},
        BadCase{"MpiSizeNotInteger", {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "x"}},
                "OMPI_COMM_WORLD_SIZE=\"x\" is not valid: expected a positive integer (e.g. 4)"},
        // TORCHELASTIC_USE_AGENT_STORE: exactly what torchrun writes (Python's str(bool)).
        BadCase{"AgentStoreLowercase", with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "true"),
                "TORCHELASTIC_USE_AGENT_STORE=\"true\" is not valid: expected True or False (as torchrun writes it)"},
        BadCase{"AgentStoreOne", with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "1"),
                "TORCHELASTIC_USE_AGENT_STORE=\"1\" is not valid: expected True or False (as torchrun writes it)"},
        BadCase{"AgentStoreEmpty", with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", ""),
                "TORCHELASTIC_USE_AGENT_STORE=\"\" is not valid: expected True or False (as torchrun writes it)"},
        // Every message names the variable of the source that was read.
        BadCase{"LocalRankWithoutLocalWorldSize",
                with(with(kTorchrun, "LOCAL_WORLD_SIZE", std::nullopt), "LOCAL_RANK", "8"),
                "LOCAL_RANK=8 must be less than the local world size 8 (LOCAL_WORLD_SIZE is not set: WORLD_SIZE)"},
        BadCase{"SlurmRankWithoutNtasks", {{"SLURM_PROCID", "3"}},
                "SLURM_PROCID=3 must be less than the world size 1 (SLURM_NTASKS is not set)"},
        BadCase{"SlurmTasksPerNodeAboveNtasks",
                {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "8"}},
                "SLURM_NTASKS_PER_NODE=8 must not exceed SLURM_NTASKS=4"},
        BadCase{"SlurmTasksPerNodeWithoutNtasks", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS_PER_NODE", "2(x2)"}},
                "SLURM_NTASKS_PER_NODE=2(x2) must not exceed the world size 1 (SLURM_NTASKS is not set)"},
        BadCase{"SlurmLocalIdAtTasksPerNode",
                {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "2(x2)"}},
                "SLURM_LOCALID=2 must be less than SLURM_NTASKS_PER_NODE=2(x2)"},
        BadCase{"SlurmLocalIdAtDerivedLocalSize",
                {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"}, {"SLURM_LOCALID", "2"}},
                "SLURM_LOCALID=2 must be less than the local world size 2 (SLURM_NTASKS_PER_NODE is not set: "
                "SLURM_NTASKS / SLURM_NNODES)"},
        BadCase{"SlurmTasksPerNodeNotACount", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS_PER_NODE", "x(x2)"}},
                "SLURM_NTASKS_PER_NODE=\"x(x2)\" is not valid: expected a task count such as 4, 4(x2) or 4,2"},
        BadCase{"SlurmTasksPerNodeZero", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS_PER_NODE", "0"}},
                "SLURM_NTASKS_PER_NODE=\"0\" is not valid: expected a task count such as 4, 4(x2) or 4,2"},
        BadCase{"SlurmNtasksNotInteger", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "four"}},
                "SLURM_NTASKS=\"four\" is not valid: expected a positive integer (e.g. 4)"},
        BadCase{"SlurmMissingMasterAddr", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}},
                "MASTER_ADDR is not set: a world of 4 ranks (SLURM_NTASKS=4) needs the host of rank 0 "
                "(e.g. start the tasks with srun, which sets SLURM_STEP_NODELIST, or MASTER_ADDR=$(scontrol show hostnames | "
                "head -n 1))"},
        BadCase{"SlurmMissingMasterPort", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"MASTER_ADDR", "n0"}},
                "MASTER_PORT is not set: a world of 4 ranks (SLURM_NTASKS=4) needs rank 0's store port "
                "(e.g. srun sets SLURM_JOB_ID, or MASTER_PORT=29500)"},
        // Slurm's variables that disagree with each other.
        BadCase{"SlurmNodeIdAtNodes",
                {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "2"}},
                "SLURM_NODEID=2 must be less than SLURM_NNODES=2"},
        BadCase{"SlurmTasksPerNodeTooFewForNtasks",
                {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_NNODES", "2"}, {"SLURM_NTASKS_PER_NODE", "2(x2)"}},
                "SLURM_NTASKS_PER_NODE=2(x2) on SLURM_NNODES=2 node(s) cannot hold SLURM_NTASKS=8 tasks"},
        BadCase{"SlurmNodeListUnclosed",
                {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", "n[1-2"}},
                "SLURM_STEP_NODELIST=\"n[1-2\" is not a Slurm node list (a '[' without ']')"},
        BadCase{"SlurmNodeListRangeNotNumbers",
                {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", "n[a-b]"}},
                "SLURM_STEP_NODELIST=\"n[a-b]\" is not a Slurm node list (a range that does not start with a number)"},
        BadCase{"SlurmNodeListLeadingComma",
                {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", ",n1"}},
                "SLURM_STEP_NODELIST=\",n1\" is not a Slurm node list (it names no node first)"},
        BadCase{"SlurmNodeListEmpty", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", ""}},
                "SLURM_STEP_NODELIST is set but empty"},
        BadCase{"SlurmJobIdNotANumber",
                {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", "n1"}, {"SLURM_JOB_ID", "x"}},
                "SLURM_JOB_ID=\"x\" is not valid: expected a job id (e.g. 4711)"},
        BadCase{"MpiRankAtSize", {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
                "OMPI_COMM_WORLD_RANK=2 must be less than OMPI_COMM_WORLD_SIZE=2"},
        BadCase{"MpiRankWithoutSize", {{"OMPI_COMM_WORLD_RANK", "1"}},
                "OMPI_COMM_WORLD_RANK=1 must be less than the world size 1 (OMPI_COMM_WORLD_SIZE is not set)"},
        BadCase{"MpiLocalSizeAboveSize",
                {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}},
                "OMPI_COMM_WORLD_LOCAL_SIZE=4 must not exceed OMPI_COMM_WORLD_SIZE=2"},
        BadCase{"MpiLocalRankAtLocalSize",
                {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                "OMPI_COMM_WORLD_LOCAL_RANK=2 must be less than OMPI_COMM_WORLD_LOCAL_SIZE=2"},
        BadCase{"MpiLocalRankWithoutLocalSize",
                {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}},
                "OMPI_COMM_WORLD_LOCAL_RANK=2 must be less than the local world size 2 "
                "(OMPI_COMM_WORLD_LOCAL_SIZE is not set: OMPI_COMM_WORLD_SIZE)"},
        BadCase{"MpiMissingMasterAddr", {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
                "MASTER_ADDR is not set: a world of 2 ranks (OMPI_COMM_WORLD_SIZE=2) needs the host of rank 0 "
                "(e.g. mpirun -x MASTER_ADDR=127.0.0.1)"},
        BadCase{"MpiMissingMasterPort",
                {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}},
                "MASTER_PORT is not set: a world of 2 ranks (OMPI_COMM_WORLD_SIZE=2) needs rank 0's store port "
                "(e.g. mpirun -x MASTER_PORT=29500)"}),
    [](const auto& info) { return std::string(info.param.name); });

// The rendezvous over a store served by someone else (torchrun's agent), and a busy port.
namespace {

World two_ranks(int rank, int port, bool agent_store, int restart_count = 0) {
  Env env = {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", std::to_string(port)}, {"TORCHELASTIC_RUN_ID", "job7"},
             {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)}};
  if (agent_store) env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  return from(env);
}

std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST(Rendezvous, AgentStoreMakesEveryRankAClientUnderTheAttemptPrefix) {
  c10d::TCPStoreOptions server_options;
  server_options.port = 0;
  server_options.isServer = true;
  server_options.timeout = std::chrono::seconds(10);
  c10d::TCPStore agent("127.0.0.1", server_options);  // what torchrun's agent serves
  const int port = agent.getPort();
  agent.set("/worker/attempt_0/tandem/run_id", std::vector<uint8_t>{'o', 'l', 'd'});  // attempt 0's leftover

  c10::intrusive_ptr<c10d::Store> stores[2];
  std::thread rank1([&] { stores[1] = tandem::comm::rendezvous(two_ranks(1, port, true, 1), std::chrono::seconds(10)); });
  stores[0] = tandem::comm::rendezvous(two_ranks(0, port, true, 1), std::chrono::seconds(10));
  rank1.join();

  EXPECT_EQ(tandem::comm::agent_store_prefix(1), "/worker/attempt_1");
  EXPECT_EQ(text(agent.get("/worker/attempt_1/tandem/run_id")), "job7");
  EXPECT_FALSE(agent.check({"tandem/run_id"}));  // nothing outside the attempt's prefix
  stores[1]->set("hello", std::vector<uint8_t>{'1'});
  EXPECT_EQ(text(stores[0]->get("hello")), "1");
  EXPECT_EQ(text(agent.get("/worker/attempt_1/hello")), "1");
  EXPECT_EQ(text(agent.get("/worker/attempt_0/tandem/run_id")), "old");  // untouched
}

TEST(Rendezvous, AgentStoreThatIsNotThereIsNamed) {
  const int port = tandem::comm::pick_free_port();
  try {
    tandem::comm::rendezvous(two_ranks(0, port, true), std::chrono::seconds(1));
    FAIL() << "rendezvous succeeded without a store";
  } catch (const tandem::Error& e) {
    const std::string expected = "rendezvous of rank 0 at the launcher's store 127.0.0.1:" + std::to_string(port) +
                                 " failed within 1 s: ";
    EXPECT_EQ(std::string(e.what()).substr(0, expected.size()), expected);
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

// Both ways rank 0 opens the store: binding loopback itself (the whole job on this host), and
// c10d binding every interface (a multi-node job, here LOCAL_WORLD_SIZE=1).
class BusyPort : public ::testing::TestWithParam<bool> {};

TEST_P(BusyPort, SaysWhatToDoInBothCases) {
  const bool multi_node = GetParam();
  const int port = tandem::comm::pick_free_port();
  const int held = tandem::comm::listen_on("127.0.0.1", port);  // another job, or a launcher's store
  World world = two_ranks(0, port, false);
  if (multi_node) world.local_world_size = 1;
  std::string message = "<no error>";
  try {
    tandem::comm::rendezvous(world, std::chrono::seconds(1));
  } catch (const tandem::Error& e) {
    message = e.what();
  }
  ::close(held);
  EXPECT_EQ(message, "port 127.0.0.1:" + std::to_string(port) +
                         " is busy. If another job holds it, choose another --master-port / MASTER_PORT (or "
                         "omit it on one node to pick a free one). If a launcher already serves the rendezvous "
                         "store there (torchrun does, and says so with TORCHELASTIC_USE_AGENT_STORE=True), "
                         "connect to it: set TORCHELASTIC_USE_AGENT_STORE=True for workers started by hand next "
                         "to a running store");
}

INSTANTIATE_TEST_SUITE_P(Rendezvous, BusyPort, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "MultiNode" : "OneHost"; });

// Note [Free port]: below the ephemeral range, where no outgoing connection can take it, and free.
TEST(FreePort, IsDrawnBelowTheKernelsEphemeralRange) {
  int low = 32768, high = 60999;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    ASSERT_EQ(std::fscanf(f, "%d %d", &low, &high), 2);
    std::fclose(f);
  }
  if (low - 20000 < 2000) GTEST_SKIP() << "the ephemeral range starts at " << low << ": no room below it";
  std::set<int> seen;
  for (int i = 0; i < 20; ++i) {
    const int port = tandem::comm::pick_free_port();
    EXPECT_GE(port, 20000);
    EXPECT_LT(port, low);
    EXPECT_FALSE(port >= 29400 && port < 29600) << port << " is in torchrun's default area";
    EXPECT_TRUE(tandem::comm::port_is_free("127.0.0.1", port));
    seen.insert(port);
  }
  EXPECT_GT(seen.size(), 10u) << "drawn at random, not the same few ports";
}
