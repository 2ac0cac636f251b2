#pragma once
// Options of tandem::Accelerator.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <torch/arg.h>

#include "tandem/accelerate/parallelism.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/options.h"
#include "tandem/dp/options.h"
#include "tandem/fsdp/options.h"
#include "tandem/nn/checkpoint_policy.h"

namespace tandem {

enum class Strategy {
  /// From what was launched: several processes -> Ddp; one process and several GPUs ->
  /// DataParallel; else Single. The Accelerator says in one line what it picked and why.
  Auto,
  /// One process, one device (the GPU of LOCAL_RANK, else the CPU).
  Single,
  /// One process driving every visible GPU (or `dp().devices()`): tandem::dp::DataParallel.
  DataParallel,
  /// One process per device, gradients averaged during backward: tandem::ddp::DistributedDataParallel.
  Ddp,
  /// One process per device, every parameter sharded (ZeRO-3): tandem::fsdp::FullyShardedDataParallel
  /// with `fsdp()`'s options; a model without units is auto-wrapped (docs/guide-fsdp.md). Never
  /// picked by Auto.
  Fsdp,
};
const char* to_string(Strategy strategy);

enum class Precision {
  /// float32 everywhere.
  No,
  /// Autocast to float16 and a GradScaler (loss scaling, skipped steps on inf/NaN).
  Fp16,
  /// Autocast to bfloat16; no scaler (bfloat16 has float32's range).
  Bf16,
};
const char* to_string(Precision precision);

/// Options of Accelerator.
///
/// Example:
///   tandem::Accelerator acc(tandem::AcceleratorOptions()
///                               .mixed_precision(tandem::Precision::Bf16)
///                               .gradient_accumulation_steps(4)
///                               .seed(42));
struct AcceleratorOptions {
  /// Which strategy wraps the model (Strategy::Auto decides from the launch).
  TORCH_ARG(Strategy, strategy) = Strategy::Auto;
  /// Autocast dtype and loss scaling.
  TORCH_ARG(Precision, mixed_precision) = Precision::No;
  /// Gradients are synchronised and the optimizer steps every this many batches (and on the
  /// last batch of the data); backward() divides the loss by it.
  TORCH_ARG(int, gradient_accumulation_steps) = 1;
  /// Seeds LibTorch's generators with seed + rank at construction (rank 0's initial weights are
  /// the ones every rank trains, as DDP broadcasts them), and the data shuffle with seed.
  TORCH_ARG(uint64_t, seed) = 0;
  /// How long any collective (and wait_for_everyone) may take before it fails naming itself.
  TORCH_ARG(std::chrono::milliseconds, collective_timeout) = comm::kDefaultCollectiveTimeout;
  /// Passed to DistributedDataParallel under Strategy::Ddp.
  TORCH_ARG(ddp::DistributedDataParallelOptions, ddp) = {};
  /// Passed to FullyShardedDataParallel under Strategy::Fsdp (auto_wrap defaults to AutoWrapPolicy()).
  /// Under mixed_precision Bf16 or Fp16 its policy's param_dtype and reduce_dtype default to that
  /// dtype, as accelerate sets FSDP2's (set param_dtype to float32 to gather in full precision).
  TORCH_ARG(fsdp::FullyShardOptions, fsdp) = {};
  /// Passed to DataParallel under Strategy::DataParallel.
  TORCH_ARG(dp::DataParallelOptions, dp) = {};
  /// The GradScaler's options under Precision::Fp16.
  TORCH_ARG(amp::GradScalerOptions, scaler) = {};
  /// Every rank sees the same number of batches: the sampler pads the last round with the
  /// first samples (gather_for_metrics drops them again). Off: the tail is dropped instead.
  TORCH_ARG(bool, even_batches) = true;
  /// Where log() appends its JSON lines (metrics.jsonl); empty: no metrics file.
  TORCH_ARG(std::string, project_dir) = "";
  /// Show a progress line on the main process while iterating a prepared loader.
  TORCH_ARG(bool, progress) = true;
  /// ZeRO stage, DeepSpeed's numbering: 0, plain DDP; 1, each process keeps the optimizer state
  /// of its share of the parameters only (tandem::zero::ShardedOptimizer, docs/guide-zero.md);
  /// 2, the gradients too (tandem::zero::GradientShardedOptimizer). Both shard across processes:
  /// DataParallel (Strategy::DataParallel, or Auto in one process with several GPUs) is refused,
  /// and a job of one process has nothing to shard and runs unsharded.
  TORCH_ARG(int, zero_stage) = 0;
  /// How the processes are laid out (tandem/accelerate/parallelism.h): replicate, shard, tp and
  /// pp sizes whose product is the number of processes. Unset: DDP replicates over every
  /// process, FSDP shards over every process; shard_size below the process count under FSDP is
  /// HSDP (shards within groups of shard_size, replicated across them).
  TORCH_ARG(ParallelismConfig, parallelism) = {};
  /// Activation checkpointing (tandem/nn/checkpoint_policy.h): the blocks this policy picks recompute
  /// their forward in backward instead of keeping its activations. Under Strategy::Fsdp it is
  /// `fsdp().activation_checkpointing()` when that is unset (units checkpoint themselves, gathered
  /// again for the recompute); under Single and Ddp prepare_model applies it to the model. Refused
  /// under DataParallel (its replicas are clones). Unset: none.
  TORCH_ARG(std::optional<nn::CheckpointPolicy>, activation_checkpointing) = std::nullopt;
};

}  // namespace tandem
