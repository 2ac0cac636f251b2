#pragma once
// `tandem run --backend mpi`: the one mpirun command line and environment the launcher runs.
//
// Note [Launching through mpirun]
// With --backend mpi the launcher starts no worker itself: it runs Open MPI's `mpirun` once, on
// the first node, and mpirun starts every rank (on other nodes through ssh, or whatever
// OMPI_MCA_plm_rsh_agent names). Ranks learn who they are from OMPI_COMM_WORLD_*, so RANK,
// WORLD_SIZE, LOCAL_RANK and the other torchrun rank variables are never exported (and are removed
// from what mpirun inherits, as are Slurm's per-task SLURM_PROCID/LOCALID/NODEID, which World
// would read first). What every rank gets with -x: MASTER_ADDR, MASTER_PORT, TANDEM_CPU_BACKEND=mpi,
// the TORCHELASTIC_* restart variables, TANDEM_LOG_DIR and OMP_NUM_THREADS (1 when several ranks
// share a node, unless set), as `tandem run`'s own workers get them.
// - --oversubscribe: torchrun never refuses a process count, and neither do we.
// - --bind-to none: Open MPI binds each rank to a core (or socket) by default when there are at most
//   2 ranks; LibTorch's intra-op thread pool would then run all its threads on that one core.
// - --tag-output: each line comes back as "[1,N]<stdout>:..."; MpirunOutput turns that into
//   "[rankN]: ..." and the per-rank logs.
// - --mca odls_base_sigkill_timeout T (T = half the grace period, at least 1 s): when mpirun ends a
//   job (a rank failed, or it got SIGTERM), Open MPI waits T, sends SIGTERM, waits T, sends SIGKILL.
#include <string>
#include <vector>

#include "launch/launch_options.h"

namespace tandem::launch {

struct MpirunCommand {
  std::vector<std::string> argv;  // argv[0] is the mpirun path
  std::vector<std::string> env;   // mpirun's environment, "KEY=VALUE"
};

/// Seconds mpirun waits between its SIGCONT, SIGTERM and SIGKILL: half the grace period, >= 1.
int mpirun_kill_step_seconds(const LaunchOptions& options);

/// The command for attempt `attempt` (TORCHELASTIC_RESTART_COUNT) of resolved `options`.
/// `as_root`: adds --allow-run-as-root (mpirun refuses root without it). `environ`: the
/// launcher's environment, what mpirun inherits minus the rank variables named above.
MpirunCommand build_mpirun_command(const LaunchOptions& options, int attempt, bool as_root,
                                   const std::vector<std::string>& environ);

}  // namespace tandem::launch
