// `tandem run` flag validation: everything is rejected before any worker starts.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "tandem/comm/net.h"
#include "tandem/error.h"
#include "launch/launch_options.h"

using tandem::launch::LaunchOptions;

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
  o.nnodes = 2;
  o.node_rank = 2;
  EXPECT_EQ(error_of(o), "--node-rank 2 is not valid: expected 0..1 for --nnodes 2");
  o.node_rank = -1;
  EXPECT_EQ(error_of(o), "--node-rank -1 is not valid: expected 0..1 for --nnodes 2");
  o = valid();
  o.nnodes = 0;
  EXPECT_EQ(error_of(o), "--nnodes 0 is not valid: expected a positive number");
  o = valid();
  o.nnodes = 2;
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
