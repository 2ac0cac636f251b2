#pragma once
// The optimizer of a FullyShardedDataParallel model, for the Accelerator (and anyone who wants
// checkpoints by parameter name): the caller's optimizer, pointed at the shards (shard_optimizer),
// stepped with every rank agreeing, and its state gathered into whole parameters' state or cut
// back into rows (zero::PartitionedOptimizer). The optimizer must step element by element (SGD,
// Adam, AdamW, RMSprop, Adagrad): a shard's step is then exactly the whole step's rows.
#include <memory>
#include <vector>

#include "tandem/fsdp/engine.h"
#include "tandem/zero/param_state.h"
#include "tandem/zero/partitioned_optimizer.h"

namespace tandem::fsdp {

class FsdpOptimizer : public zero::PartitionedOptimizer {
 public:
  /// `optimizer` holds the model's parameters (before its first step); it is changed in place.
  /// `optimizer` must outlive this object. Throws tandem::Error for another optimizer type.
  FsdpOptimizer(torch::optim::Optimizer& optimizer, std::shared_ptr<ShardedParameters> shards);

  bool step(const Stepper& stepper) override;
  void step();
  void zero_grad() override;
  double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0) override;
  const std::vector<std::vector<at::Tensor>>& all_params() const override { return all_; }
  std::vector<std::pair<at::Tensor, NamedState>> gather_state() override;
  std::optional<std::vector<at::Tensor>> gradient_pieces(const at::Tensor& param) const override;

  /// This rank's rows of every parameter's state (none for parameters whose rows it does not
  /// hold, but rank 0's empty rows of a parameter with no rows; "step" from every rank that has
  /// state). No collective: what a sharded checkpoint writes.
  std::vector<OwnedState> owned_state() const override;
  HeldRows held_rows(const at::Tensor& param) const override;
  StateLayout state_layout() const override { return StateLayout::ByRows; }
  /// The rows of `param` this rank keeps: [first_row, first_row + owned_rows).
  ShardSpec spec_of(const at::Tensor& param) const;
  /// The dtype and device of `param`'s shard (and so of its state).
  at::TensorOptions shard_options(const at::Tensor& param) const;
  /// `state_of(param)` holds this rank's rows of the parameter's state (shape [owned_rows,
  /// shape[1:]...]), as stage_optimizer_state reads them with spec_of's rows.
  BuiltState build_state(const StateOf& state_of) const override;
  void install_state(BuiltState built) override;
  torch::optim::Optimizer& optimizer() override { return optimizer_; }

 private:
  torch::optim::Optimizer& optimizer_;
  std::shared_ptr<ShardedParameters> engine_;
  zero::OptimizerKind kind_;
  std::vector<std::vector<at::Tensor>> all_;     // per group, the model's parameters
  std::vector<std::vector<at::Tensor>> shards_;  // per group, what the optimizer holds
};

}  // namespace tandem::fsdp
