// `tandem run` flag validation: everything is rejected before any worker starts.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "tandem/comm/net.h"
#include "tandem/error.h"
#include "flag_errors.h"
#include "launch/launch_options.h"

using tandem::launch::LaunchOptions;
using tandem::launch::testing::flags_error;

namespace {

std::string error_of(LaunchOptions o, int gpus = 0, int cpus = 2) {
  try {
    tandem::launch::resolve(o, gpus, cpus);
  } catch (const tandem::Error& e) {
    return e.what();
  }
  return "<no error>";
}

LaunchOptions valid() {
  LaunchOptions o;
  o.command = {"/bin/true"};
  return o;
}

}  // namespace

TEST(ResolveNproc, NumbersAndKeywords) {
  using tandem::launch::resolve_nproc;
  EXPECT_EQ(resolve_nproc("3", 0, 2), 3);
  EXPECT_EQ(resolve_nproc("cpu", 8, 2), 2);
  EXPECT_EQ(resolve_nproc("gpu", 8, 2), 8);
  EXPECT_EQ(resolve_nproc("auto", 8, 2), 8);
  EXPECT_EQ(resolve_nproc("auto", 0, 2), 2);
}

TEST(ResolveNproc, RejectsBadSpecs) {
  for (std::string bad : {"0", "-1", "two", "", "1.5"}) {
    LaunchOptions o = valid();
    o.nproc_per_node = bad;
    EXPECT_EQ(error_of(o), "--nproc-per-node '" + bad +
                               "' is not valid: expected a positive number, gpu, cpu or auto");
  }
  LaunchOptions o = valid();
  o.nproc_per_node = "gpu";
  EXPECT_EQ(error_of(o, 0), "--nproc-per-node gpu: no CUDA device is visible");
}

TEST(LaunchOptions, FillsSingleNodeDefaults) {
  LaunchOptions o = valid();
  tandem::launch::resolve(o, 0, 2);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_GT(o.master_port, 0);
  EXPECT_FALSE(o.run_id.empty());
  EXPECT_NE(o.log_dir.find(o.run_id), std::string::npos);
  EXPECT_EQ(o.program_path, "/bin/true");
}

TEST(LaunchOptions, FindsProgramsOnPath) {
  LaunchOptions o = valid();
  o.command = {"true"};
  tandem::launch::resolve(o, 0, 2);
  EXPECT_EQ(o.program_path.substr(o.program_path.size() - 5), "/true");
}

TEST(LaunchOptions, RejectsBadNodes) {
  LaunchOptions o = valid();
  o.nnodes_spec = "2";
  o.node_rank = 2;
  EXPECT_EQ(error_of(o), "--node-rank 2 is not valid: expected 0..1 for --nnodes 2");
  o.node_rank = -1;
  EXPECT_EQ(error_of(o), "--node-rank -1 is not valid: expected 0..1 for --nnodes 2");
  o = valid();
  o.nnodes_spec = "0";
  EXPECT_EQ(error_of(o), "--nnodes 0 is not valid: expected a positive number, or MIN:MAX for an elastic job");
  o = valid();
  o.nnodes_spec = "2";
  EXPECT_EQ(error_of(o), "--master-addr is required when --nnodes > 1 (the host of node 0)");
  o.master_addr = "10.0.0.1";
  EXPECT_EQ(error_of(o), "--master-port is required when --nnodes > 1 (the same on every node)");
}

TEST(LaunchOptions, RejectsBadPortsAndRestarts) {
  LaunchOptions o = valid();
  o.master_port = 70000;
  EXPECT_EQ(error_of(o), "--master-port 70000 is not valid: expected 1..65535");
  o = valid();
  o.max_restarts = -1;
  EXPECT_EQ(error_of(o), "--max-restarts must be >= 0");
}

TEST(LaunchOptions, RejectsABusyPort) {
  int port = tandem::comm::pick_free_port();
  int held = tandem::comm::listen_on("127.0.0.1", port);
  LaunchOptions o = valid();
  o.master_port = port;
  EXPECT_EQ(error_of(o), "--master-port " + std::to_string(port) +
                             " is busy on 127.0.0.1: another process holds it; choose another port"
                             " or omit --master-port to pick a free one");
  ::close(held);
}

TEST(LaunchOptions, RejectsMissingOrUnrunnablePrograms) {
  LaunchOptions o = valid();
  o.command = {"/nonexistent/worker"};
  EXPECT_EQ(error_of(o), "worker program '/nonexistent/worker' does not exist");
  o.command = {"no-such-program-tandem"};
  EXPECT_EQ(error_of(o), "worker program 'no-such-program-tandem' not found on PATH");
  o.command = {"/tmp"};
  EXPECT_EQ(error_of(o), "worker program '/tmp' is a directory");
  const std::string plain = "/tmp/tandem_not_executable_" + std::to_string(::getpid());
  std::fclose(std::fopen(plain.c_str(), "w"));
  ::chmod(plain.c_str(), 0644);
  o.command = {plain};
  EXPECT_EQ(error_of(o), "worker program '" + plain + "' is not executable");
  ::unlink(plain.c_str());
  o.command = {};
  EXPECT_EQ(error_of(o), "no worker program given: tandem run [flags] -- PROGRAM [ARGS]");
}

// --nnodes MIN:MAX (Note [Elastic rounds]): torchrun's spelling, one line for each bad spec.
TEST(LaunchOptions, ElasticFlags) {
  LaunchOptions o = valid();
  o.nnodes_spec = "1:2";
  o.master_addr = "10.0.0.1";
  o.master_port = 29400;
  o.rdzv_conf = "last_call_timeout=2.5,join_timeout=60";
  EXPECT_EQ(flags_error(o), "<no error>");
  tandem::launch::resolve_flags(o, 0, 2);
  EXPECT_TRUE(o.elastic);
  EXPECT_EQ(o.rdzv.min_nodes, 1);
  EXPECT_EQ(o.rdzv.max_nodes, 2);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.rdzv.last_call.count(), 2500);
  EXPECT_EQ(o.rdzv.join_timeout.count(), 60000);

  auto elastic = [] {
    LaunchOptions e = valid();
    e.nnodes_spec = "1:2";
    e.master_addr = "10.0.0.1";
    e.master_port = 29400;
    return e;
  };
  o = elastic();
  o.nnodes_spec = "3:2";
  EXPECT_EQ(flags_error(o), "--nnodes 3:2 is not valid: MIN (3) is more than MAX (2)");
  for (std::string bad : {"0:2", "1:", ":2", "a:b", "1:2:3", "-1:2"}) {
    o = elastic();
    o.nnodes_spec = bad;
    EXPECT_EQ(flags_error(o), "--nnodes " + bad + " is not valid: expected a positive number, or MIN:MAX for an elastic job")
        << bad;
  }
  o = elastic();
  o.node_rank_given = true;
  EXPECT_EQ(flags_error(o), "--node-rank is not used with --nnodes 1:2: the elastic rendezvous numbers the nodes");
  o = elastic();
  o.backend = "mpi";
  EXPECT_EQ(flags_error(o), "--nnodes 1:2 (elastic) needs tandem run's own workers: --backend mpi starts one fixed world");
  o = elastic();
  o.master_addr.clear();
  EXPECT_EQ(flags_error(o), "--master-addr is required with --nnodes 1:2 (the host that serves the elastic rendezvous; the same on every node)");
  o = elastic();
  o.master_port = 0;
  EXPECT_EQ(flags_error(o), "--master-port is required with --nnodes 1:2 (the same on every node)");
  o = elastic();
  o.rdzv_conf = "close_timeout=3";
  EXPECT_EQ(flags_error(o), "--rdzv-conf: unknown key 'close_timeout' (known: last_call_timeout, join_timeout)");
  for (std::string bad : {"last_call_timeout", "last_call_timeout=", "last_call_timeout=-1", "join_timeout=1e9", "join_timeout=5s"}) {
    o = elastic();
    o.rdzv_conf = bad;
    EXPECT_EQ(flags_error(o), "--rdzv-conf '" + bad + "' is not valid: expected last_call_timeout=SECONDS or join_timeout=SECONDS")
        << bad;
  }
  o = valid();
  o.rdzv_conf = "join_timeout=5";
  EXPECT_EQ(flags_error(o), "--rdzv-conf is for an elastic job: give --nnodes MIN:MAX");
  o = elastic();
  o.nnodes_spec = "1:1";  // one node at most: no endpoint needed, it is this host
  o.master_addr.clear();
  o.master_port = 0;
  EXPECT_EQ(flags_error(o), "<no error>");
}
