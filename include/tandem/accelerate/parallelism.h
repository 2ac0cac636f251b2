#pragma once
// ParallelismConfig: how the Accelerator lays the processes out for the strategies it composes
// (accelerate's ParallelismConfig, torchtitan's parallel dims), and the rule that turns it and
// the asked strategy into one plan (Note [Parallelism plan]).
//
// Example: 8 processes, FSDP within groups of 4 and 2 replicas of those (HSDP):
//   tandem::Accelerator acc(tandem::AcceleratorOptions()
//                               .strategy(tandem::Strategy::Fsdp)
//                               .parallelism(tandem::ParallelismConfig().shard_size(4)));
#include <string>

#include <torch/arg.h>

namespace tandem {

enum class Strategy;

/// The sizes of the mesh dimensions; their product is the number of processes.
struct ParallelismConfig {
  /// Data-parallel replicas: DDP's all-reduce group, HSDP's replicas. 0: what the other sizes
  /// leave (the strategy decides when shard_size is 0 too).
  TORCH_ARG(int, replicate_size) = 0;
  /// Data-parallel shards: FSDP shards every parameter over this many processes (Strategy::Fsdp;
  /// with replicate_size > 1 too, HSDP). 0: what the other sizes leave under Strategy::Fsdp, 1
  /// otherwise.
  TORCH_ARG(int, shard_size) = 0;
  /// Tensor parallelism's group size: the model's layers are cut over this many neighbouring
  /// processes by the plan given to Accelerator::prepare_model (tandem/tp/parallelize.h).
  TORCH_ARG(int, tp_size) = 1;
  /// Pipeline parallelism's group size: the processes one pipeline's stages run on
  /// (Accelerator::prepare_pipeline; docs/guide-pp.md). Not with tp_size > 1 yet.
  TORCH_ARG(int, pp_size) = 1;
};

/// A ParallelismConfig resolved for a job: every size known, the strategy that composes them.
struct ParallelismPlan {
  Strategy strategy;
  int replicate = 1, shard = 1, tp = 1, pp = 1;
  /// Whether FSDP's shards are replicated (Strategy::Fsdp with replicate > 1: HSDP; with shard 1
  /// each replica holds whole parameters, as fully_shard on a (replicate, 1) mesh does).
  bool hybrid() const;
  /// "replicate 2 x shard 2" (only the sizes above 1; "1" for one process).
  std::string describe() const;
};

/// Note [Parallelism plan]: fills the sizes left at 0 and picks the strategy `asked` leaves open
/// (Auto with shard > 1 is Fsdp); throws a one-line tandem::Error for a size below its minimum,
/// sizes that do not multiply to `processes`, pipeline parallelism, or a strategy that cannot hold
/// the layout (shards without Fsdp, tensor parallelism under Single or DataParallel).
ParallelismPlan plan_parallelism(const ParallelismConfig& config, Strategy asked, int processes);

}  // namespace tandem
