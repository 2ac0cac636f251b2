#pragma once
// ZeRO stage 2 (Rajbhandari et al., arXiv:1910.02054): gradients and optimizer state sharded.
//
// Note [Flat shards]
// - DDP's reducer reduce-scatters each bucket (Note [Sharded gradients] in
//   src/zero/reduce_scatter_buckets.h, the reduction this class gives the reducer), so a
//   rank holds a contiguous 1/W slice of every bucket's flat layout, which may cut a parameter.
//   This class forms those buckets from the optimizer's param groups (a bucket never mixes two
//   groups, whose hyper-parameters differ), walking the parameters in reverse order as DDP does,
//   each group filling its own bucket up to DDP's size limits; buckets launch in the order they
//   fill.
// - The optimizer the caller built is changed in place: each group's parameters become this
//   rank's shards of that group's buckets, 1-D tensors of padded/W elements. Its step is then
//   the unsharded step restricted to those elements, which is the same arithmetic for the
//   element-wise optimizers (SGD, Adam, AdamW, RMSprop, Adagrad; others are refused); the padding
//   has zero gradient and stays zero.
// - step(): copy this rank's slices of the parameters into the shards, point the shards'
//   gradients at the reducer's averaged slices, step (every rank agrees to step or skip), then
//   all-gather every bucket's shards into the parameters.
// - clip_grad_norm(parameters): the norm over those parameters' pieces of the shards of all ranks
//   (one all-reduce), then those pieces' gradients scaled as torch scales them.
//
//   tandem::ddp::DistributedDataParallel model(net, pg);
//   torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   tandem::zero::GradientShardedOptimizer optimizer(adamw, model->reducer(), pg);  // before the first forward
//   loss.backward();                        // gradients reduce-scattered; no full .grad is kept
//   optimizer.step();
//   optimizer.zero_grad();
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "tandem/comm/process_group.h"
#include "tandem/ddp/reducer.h"
#include "tandem/zero/param_state.h"
#include "tandem/zero/partitioned_optimizer.h"

namespace tandem::zero {

class GradientShardedOptimizer : public PartitionedOptimizer {
 public:
  /// Builds the reducer's buckets from `optimizer`'s param groups and replaces the groups'
  /// parameters by this rank's shards (any state the optimizer held goes). Every parameter the
  /// reducer reduces must be in exactly one group, and every group parameter in the reducer.
  /// Before the model's first forward. `optimizer` and `reducer` must outlive this object.
  /// Throws tandem::Error for an optimizer that is not element-wise, or a reducer that cannot shard.
  GradientShardedOptimizer(torch::optim::Optimizer& optimizer, ddp::Reducer& reducer,
                           std::shared_ptr<comm::ProcessGroup> pg);
  GradientShardedOptimizer(const GradientShardedOptimizer&) = delete;
  GradientShardedOptimizer& operator=(const GradientShardedOptimizer&) = delete;

  /// Steps the shards with the gradients of the last synced backward, then every rank gets every
  /// updated parameter. Collective. Throws (on every rank) when a rank's step failed.
  void step();
  /// The same through `stepper` (e.g. a GradScaler's step); every rank must agree (checked).
  bool step(const std::function<bool(torch::optim::Optimizer&)>& stepper) override;
  /// Zeroes the shards' gradients (they stay the slices the reducer reduce-scatters into, which the
  /// next synced backward overwrites) and drops any gradient the parameters hold (accumulated
  /// under no_sync).
  void zero_grad() override;
  /// torch.nn.utils.clip_grad_norm_ over `parameters`, from every rank's pieces of them in the
  /// shards: returns the total norm (the same on every rank) and scales those pieces' gradients
  /// by min(1, max_norm / (norm + 1e-6)). Collective.
  double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0) override;

  /// Every parameter of the groups as given at construction.
  const std::vector<std::vector<at::Tensor>>& all_params() const override { return all_; }
  /// Elements of the shards this rank holds, padding included (the gradient and each state
  /// buffer are this many elements).
  int64_t shard_numel() const;
  torch::optim::Optimizer& optimizer() override { return optimizer_; }
  StateLayout state_layout() const override { return StateLayout::Whole; }  // gathered whole (gather_state)

  /// Checkpoints: every parameter's state, whole and shaped like it ((key, tensor) as
  /// zero::state_tensors gives them), gathered from every rank's shards. Collective; every rank
  /// gets all of it. Parameters without state yet (no step taken) are left out.
  std::vector<std::pair<at::Tensor, NamedState>> gather_state() override;
  /// Checkpoints: this rank's shards' state cut from every parameter's whole state (`state_of(param)`,
  /// null when it has none), one per bucket, checked but not installed: the parameters of one
  /// bucket must all have state or none, with one step count (a shard has one), else tandem::Error.
  BuiltState build_state(const StateOf& state_of) const override;
  /// Replaces the shards' state by what build_state made (does not throw for its result).
  void install_state(BuiltState built) override;
  std::optional<std::vector<at::Tensor>> gradient_pieces(const at::Tensor& param) const override;

 private:
  struct Piece {  // elements [param_offset, +length) of a parameter at [shard_offset, +length) of a shard
    size_t param;
    int64_t param_offset, shard_offset, length;
  };
  struct FlatBucket {
    size_t group = 0;
    std::vector<size_t> params;     // indices into params_, in the bucket's order
    std::vector<int64_t> offsets;   // of each in the flat layout
    int64_t padded = 0, per_rank = 0;
    at::Tensor shard;               // this rank's slice: the optimizer's parameter
    at::Tensor grad;                // its averaged gradient, which the reducer reduce-scatters into
    std::vector<Piece> mine;
  };
  void gather_parameters();

  torch::optim::Optimizer& optimizer_;
  std::shared_ptr<comm::ProcessGroup> pg_;
  OptimizerKind kind_;
  std::vector<at::Tensor> params_;                // the reducer's parameters
  std::unordered_map<const void*, size_t> index_of_;  // a parameter's TensorImpl -> its index in params_
  std::vector<std::vector<at::Tensor>> all_;      // per group, as given
  std::vector<FlatBucket> buckets_;
  std::vector<std::vector<at::Tensor>> shards_;   // per group, what the optimizer holds
};

}  // namespace tandem::zero
