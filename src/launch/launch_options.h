#pragma once
// What `tandem run` was asked to do, validated before anything starts.
// Flags mirror torchrun's where the meaning is the same (docs/guide.md, "tandem run").
#include <chrono>
#include <string>
#include <vector>

#include "launch/elastic_rounds.h"

namespace tandem::launch {

constexpr std::chrono::milliseconds kDefaultGracePeriod{3000};

struct LaunchOptions {
  std::string nproc_per_node = "1";  // a number, "gpu", "cpu" or "auto"
  std::string nnodes_spec = "1";      // N, or MIN:MAX for an elastic job (Note [Elastic rounds])
  int nnodes = 1;                    // resolved: N, or MAX
  int node_rank = 0;
  std::string master_addr;           // default 127.0.0.1 on one node; required on several
  int master_port = 0;               // 0: pick a free one (one node only)
  int max_restarts = 0;
  std::string run_id;                // default: random on one node, "<addr>:<port>" on several
  std::string log_dir;               // default: $TMPDIR/tandem-<run id>
  std::chrono::milliseconds grace_period = kDefaultGracePeriod;  // SIGTERM -> SIGKILL
  std::vector<std::string> command;  // the worker program and its arguments
  std::string backend = "auto";      // auto | gloo | mpi (Note [Launching through mpirun])
  std::string hosts;                 // --hosts h1,h2,...: only with backend mpi
  std::string rdzv_conf;             // --rdzv-conf last_call_timeout=S,join_timeout=S (elastic)
  bool nnodes_given = false;         // --nnodes / --node-rank appeared on the command line
  bool node_rank_given = false;

  // Resolved by resolve():
  int nproc = 0;                     // workers on this node
  std::string program_path;          // command[0] found on PATH, checked executable
  std::vector<std::string> host_list;  // hosts split at commas, checked (backend mpi)
  std::string mpirun_path;           // Open MPI's mpirun found on PATH (backend mpi)
  bool elastic = false;              // --nnodes MIN:MAX
  ElasticConfig rdzv;                // its nodes and times
};

/// The message when --backend mpi finds no mpirun (a test matches it).
constexpr const char* kNoMpirunMessage = "--backend mpi needs Open MPI's mpirun on PATH (Debian: openmpi-bin)";

/// Number of workers for a --nproc-per-node spec. Throws tandem::Error.
int resolve_nproc(const std::string& spec, int gpu_count, int cpu_count);

/// Validates every field, fills the resolved ones and the defaults. Throws tandem::Error with a
/// one-line message naming the flag; nothing has been started when it throws.
void resolve(LaunchOptions& options, int gpu_count, int cpu_count);

/// resolve()'s first part, which reads nothing but the options and the two counts (no PATH
/// lookup, no port probe): nproc, every flag's range, the master address default. The CLI fuzzer
/// calls it alone, since the rest depends on the host.
void resolve_flags(LaunchOptions& options, int gpu_count, int cpu_count);

/// The absolute path execve() will run for `program`: a path is checked as is, a bare name is
/// searched on PATH. Throws tandem::Error when missing, a directory or not executable.
std::string find_program(const std::string& program);

/// Open MPI's mpirun on PATH (find_program's checks); throws tandem::Error(kNoMpirunMessage).
std::string find_mpirun();

}  // namespace tandem::launch
