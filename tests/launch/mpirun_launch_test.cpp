// `tandem run --backend mpi` without mpirun: the flags, the mpirun command line, and the parser
// that turns mpirun's --tag-output tags into "[rankN]: " lines and per-rank logs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "flag_errors.h"
#include "launch/launch_options.h"
#include "launch/mpirun_command.h"
#include "launch/mpirun_output.h"
#include "tandem/error.h"

using tandem::launch::LaunchOptions;
using tandem::launch::testing::flags_error;

namespace {

LaunchOptions mpi_options() {
  LaunchOptions o;
  o.backend = "mpi";
  o.command = {"/bin/echo", "-n", "hi"};
  o.program_path = "/bin/echo";
  o.mpirun_path = "/usr/bin/mpirun";
  return o;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST(MpiFlags, HostsImplyNnodesAndMasterAddr) {
  LaunchOptions o = mpi_options();
  o.hosts = "node-a,10.0.0.2";
  o.nproc_per_node = "4";
  tandem::launch::resolve_flags(o, 0, 2);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.master_addr, "node-a");
  EXPECT_EQ(o.host_list, (std::vector<std::string>{"node-a", "10.0.0.2"}));
}

TEST(MpiFlags, Errors) {
  LaunchOptions o = mpi_options();
  o.backend = "openmpi";
  EXPECT_EQ(flags_error(o), "--backend 'openmpi' is not valid: expected auto, gloo or mpi");
  o = mpi_options();
  o.backend = "gloo";
  o.hosts = "a";
  EXPECT_EQ(flags_error(o), "--hosts needs --backend mpi (without it, run tandem on every node with --nnodes and --node-rank)");
  o = mpi_options();
  o.node_rank_given = true;
  EXPECT_NE(flags_error(o).find("--node-rank is not used with --backend mpi"), std::string::npos);
  o = mpi_options();
  o.hosts = "a,b";
  o.nnodes_spec = "3";
  o.nnodes_given = true;
  EXPECT_EQ(flags_error(o), "--nnodes 3 does not match the 2 host(s) of --hosts a,b (omit --nnodes: the host count implies it)");
  o = mpi_options();
  o.nnodes_spec = "2";
  o.nnodes_given = true;
  EXPECT_EQ(flags_error(o), "--nnodes 2 with --backend mpi needs --hosts h1,h2,... naming the 2 nodes mpirun starts ranks on");
  for (std::string bad : {"a,", ",a", "a,,b", "a b", "a;b"}) {
    o = mpi_options();
    o.hosts = bad;
    EXPECT_NE(flags_error(o), "<no error>") << bad;
  }
  o = mpi_options();
  o.hosts = "a,a";
  EXPECT_EQ(flags_error(o), "--hosts: 'a' appears twice; each node once");
}

TEST(MpirunCommand, OneNode) {
  LaunchOptions o = mpi_options();
  o.nproc = 2;
  o.master_addr = "127.0.0.1";
  o.master_port = 29500;
  o.run_id = "abc";
  o.log_dir = "/tmp/logs";
  o.max_restarts = 2;
  auto c = tandem::launch::build_mpirun_command(o, 1, /*as_root=*/false,
                                                {"PATH=/bin", "RANK=3", "SLURM_PROCID=1", "MASTER_PORT=1"});
  EXPECT_EQ(joined(c.argv),
            "/usr/bin/mpirun -np 2 --oversubscribe --bind-to none --tag-output --mca odls_base_sigkill_timeout 2 "
            "-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 -x TANDEM_CPU_BACKEND=mpi -x TANDEM_LOG_DIR=/tmp/logs "
            "-x TORCHELASTIC_MAX_RESTARTS=2 -x TORCHELASTIC_RESTART_COUNT=1 -x TORCHELASTIC_RUN_ID=abc "
            "-x TORCHELASTIC_USE_AGENT_STORE=False -x OMP_NUM_THREADS=1 /bin/echo -n hi");
  EXPECT_TRUE(std::count(c.env.begin(), c.env.end(), "PATH=/bin"));
  EXPECT_TRUE(std::count(c.env.begin(), c.env.end(), "MASTER_PORT=29500"));
  for (const auto& e : c.env) {
    EXPECT_NE(e.rfind("RANK=", 0), 0u) << e;
    EXPECT_NE(e.rfind("SLURM_PROCID=", 0), 0u) << e;
    EXPECT_NE(e, "MASTER_PORT=1");
  }
}

TEST(MpirunCommand, SeveralNodesAsRootWithOwnOmpThreads) {
  LaunchOptions o = mpi_options();
  o.hosts = "h1,h2";
  o.nproc_per_node = "3";
  o.grace_period = std::chrono::milliseconds(0);
  tandem::launch::resolve_flags(o, 0, 2);
  auto c = tandem::launch::build_mpirun_command(o, 0, /*as_root=*/true, {"OMP_NUM_THREADS=4"});
  const std::string line = joined(c.argv);
  EXPECT_NE(line.find("/usr/bin/mpirun -np 6 --oversubscribe --bind-to none --allow-run-as-root --tag-output "
                      "--host h1:3,h2:3 --map-by ppr:3:node --mca odls_base_sigkill_timeout 1 -x MASTER_ADDR=h1 "),
            std::string::npos) << line;
  EXPECT_NE(line.find(" -x OMP_NUM_THREADS /bin/echo"), std::string::npos) << line;
}

TEST(MpirunOutput, RewritesTagsAndKeepsLogs) {
  char dir[] = "/tmp/mpirun_output_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  {
    tandem::launch::MpirunOutput o(dir, 0, 2, out, err);
    // A rank's piece without a newline runs into the next tag; a tag may be cut by a read.
    const std::string stdout_bytes =
        "[1,0]<stdout>:partial[1,1]<stdout>:one\n[1,0]<stdout>: rest\n[1,1]<std"
        "out>:two [x] [1,9]<stdout>: not a rank of 2\nmpirun says hello\n[1,0]<stdout>:tail";
    for (char c : stdout_bytes) o.feed(false, &c, 1);  // byte by byte: every cut
    const std::string stderr_bytes =
        "[1,1]<stderr>:boom\n"
        "  Process name: [[30548,1],1]\n  Exit code:    3\n";
    o.feed(true, stderr_bytes.data(), stderr_bytes.size());
    o.finish();
    EXPECT_EQ(o.failed_rank(), 1);
    EXPECT_EQ(o.mpirun_summary(), "Process name: [[30548,1],1]; Exit code: 3");
  }
  auto text = [](std::FILE* f) {
    std::rewind(f);
    std::string s;
    char b[4096];
    size_t n;
    while ((n = std::fread(b, 1, sizeof(b), f)) > 0) s.append(b, n);
    std::fclose(f);
    return s;
  };
  EXPECT_EQ(text(out),
            "[rank1]: one\n[rank0]: partial rest\n[rank1]: two [x] [1,9]<stdout>: not a rank of 2\n"
            "mpirun says hello\n[rank0]: tail\n");
  EXPECT_EQ(text(err), "[rank1]: boom\n  Process name: [[30548,1],1]\n  Exit code:    3\n");
  const std::string d = dir;
  EXPECT_EQ(slurp(d + "/attempt_0/rank_0.stdout.log"), "partial rest\ntail");
  EXPECT_EQ(slurp(d + "/attempt_0/rank_1.stdout.log"), "one\ntwo [x] [1,9]<stdout>: not a rank of 2\n");
  EXPECT_EQ(slurp(d + "/attempt_0/rank_1.stderr.log"), "boom\n");
  EXPECT_EQ(slurp(d + "/attempt_0/mpirun.log"), "mpirun says hello\n  Process name: [[30548,1],1]\n  Exit code:    3\n");
  std::system((std::string("rm -rf ") + dir).c_str());
}
