#pragma once
// One way to lay a training job out (Note [Configurations] in configuration.cpp): how the state
// is sharded, the data-parallel, tensor-parallel and pipeline sizes, activation checkpointing and
// microbatches; and what one pipeline stage's rank holds of the model under it.
#include <cstdint>
#include <string>

#include "plan/hardware.h"
#include "plan/model.h"

namespace tandem::plan {

/// What is planned: a model, the sequences per optimizer step across the job, the precision
/// ("fp32", or "bf16": mixed, 16-bit compute with float32 master weights), the optimizer ("adam",
/// or "sgd" with momentum), the hardware.
struct Job {
  Model model;
  int64_t global_batch = 0;
  std::string precision = "bf16";
  std::string optimizer = "adam";
  Profile profile;
};

/// What backward recomputes: nothing, torchtitan's per-op selective policy (planned for
/// comparison: Tandem checkpoints whole blocks), or every block.
enum class Checkpointing { None, Selective, Full };
const char* to_string(Checkpointing c);  // "-", "sac", "ckpt": as configuration names show it
Checkpointing parse_checkpointing(const std::string& text);  // none, selective, full

struct Configuration {
  std::string sharding = "ddp";  // ddp, zero1, zero2, fsdp (shard = dp), hsdp (1 < shard < dp)
  int dp = 1, shard = 1, tp = 1, pp = 1;  // dp x tp x pp = devices; shard: the group model state is cut over
  Checkpointing checkpointing = Checkpointing::None;
  bool sequence_parallel = false;  // under TP: the norms and the residual stream cut by sequence too
  int microbatches = 1;          // per step: a pipeline's, or gradient accumulation without one
  int64_t local_batch = 0;       // sequences per data-parallel rank per step

  std::string name() const;      // "fsdp dp8 tp1 pp1 ckpt m1", "... tp8sp ..." — what the tables and --json call it
  /// How many devices the model state is divided over for weights, gradients and optimizer state.
  int weight_shards() const;
  int gradient_shards() const;
  int optimizer_shards() const;
};

/// What the rank of one pipeline stage holds (every tensor-parallel rank the same, the norms'
/// few whole parameters counted as cut).
struct StageShare {
  int64_t blocks = 0;              // the stage's blocks (the first stages take the remainder)
  bool embedding = false, head = false;
  double params = 0;               // this rank's parameters
  double matmul_params = 0;        // what its matmuls multiply per token
  double largest_unit_params = 0;  // the largest FSDP unit (a block, the embedding or the head), this rank's
};
StageShare stage_share(const Model& model, const Configuration& config, int stage);
/// Values per token and block whole on every tensor-parallel rank (the norms' inputs and outputs):
/// 4 x dim, or none under sequence parallelism (Note [Planned models]).
double whole_values_per_token(const Model& model, const Configuration& config);

/// Bytes per parameter of the compute copy, the gradient, and the optimizer state (Adam's two
/// moments or SGD's momentum, and the float32 master copy under bf16): with Adam 4/4/8 under fp32,
/// 2/2/12 under bf16 (the ZeRO paper's 16 bytes per parameter with K = 12); with SGD 4/4/4 and
/// 2/2/8. `update` is what the optimizer's step reads and writes per parameter.
struct StateBytes {
  double weight = 0, gradient = 0, optimizer = 0, activation = 0, update = 0;
  double ops_per_tensor = 0;  // the operators its step runs per parameter tensor
};
StateBytes state_bytes(const std::string& precision, const std::string& optimizer = "adam");

}  // namespace tandem::plan
