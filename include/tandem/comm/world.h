#pragma once
// World: who this process is in the job, read from the launch environment.
//
// Sources, first match wins (see docs/guide.md, "Environment contract"):
//   1. torchrun / `tandem run`: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//      MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
//      TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE
//   2. Slurm:    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (+ SLURM_NTASKS_PER_NODE, SLURM_NODEID)
//   3. Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                OMPI_COMM_WORLD_LOCAL_SIZE
//   4. nothing:  a world of one.
// MASTER_ADDR / MASTER_PORT are read for every source; they are required when WORLD_SIZE > 1.
//
// Example:
//   auto world = tandem::comm::World::from_env();
//   if (world.is_main()) std::cout << world.describe() << "\n";
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <c10/core/Device.h>

namespace tandem::comm {

enum class WorldSource { Single, Torchrun, Slurm, OpenMpi };
const char* to_string(WorldSource source);

struct World {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;  // the node's index (torchrun's GROUP_RANK)
  std::string master_addr;
  int master_port = 0;
  /// Where master_addr came from, for messages: "MASTER_ADDR", or the Slurm variable it was
  /// derived from ("the first node of SLURM_STEP_NODELIST=gpu[07-08]", Note [Slurm's rank 0]).
  std::string master_addr_from = "MASTER_ADDR";
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: the launcher started the workers again
  int max_restarts = 0;
  int requeue_count = 0;  // SLURM_RESTART_COUNT: Slurm started the job again (requeued)
  std::string run_id;
  /// TORCHELASTIC_USE_AGENT_STORE=True: the launcher (torchrun's agent) already serves the
  /// rendezvous store at MASTER_ADDR:MASTER_PORT, so every rank, rank 0 included, connects to it
  /// as a client (Note [Rendezvous] in rendezvous.h). Absent or False: rank 0 hosts the store.
  bool use_agent_store = false;
  WorldSource source = WorldSource::Single;
  /// Intra-op threads the process should use, 0: leave LibTorch's choice alone. Set under Slurm
  /// when OMP_NUM_THREADS is not (Note [Threads under srun]); ProcessGroup::create applies it.
  int intra_op_threads = 0;

  /// Reads the process environment. Throws tandem::Error naming the variable on bad input.
  static World from_env();
  /// Same, over any lookup (tests pass a map).
  using Lookup = std::function<std::optional<std::string>(const std::string& name)>;
  static World from_lookup(const Lookup& lookup);

  bool is_distributed() const { return world_size > 1; }
  bool is_main() const { return rank == 0; }
  bool is_local_main() const { return local_rank == 0; }
  /// Whether every rank runs on this host (then the store and Gloo can stay on loopback).
  bool single_node() const { return local_world_size == world_size; }

  /// The device this rank should use: cuda:LOCAL_RANK when `use_cuda`, else cpu. Throws
  /// tandem::Error for a local rank above 127, which no LibTorch device index holds.
  c10::Device device(bool use_cuda) const;

  /// One line, for logs and bug reports.
  std::string describe() const;
};

}  // namespace tandem::comm
