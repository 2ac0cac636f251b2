#pragma once
// ZeRO stage 1 (Rajbhandari et al., arXiv:1910.02054) over a LibTorch optimizer the caller already
// has: each rank keeps optimizer state for, and steps, only the parameters it owns (PyTorch's
// ZeroRedundancyOptimizer assignment, tandem/zero/partition.h); after the step each owner
// broadcasts its updated parameters, one coalesced message per rank, so every rank holds the
// same weights again. Gradients must already agree across ranks (DDP averages them), and the
// result is then bit for bit the unsharded optimizer's (Note [Sharding an optimizer in place]).
//
//   tandem::ddp::DistributedDataParallel model(net, pg);
//   torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   tandem::zero::ShardedOptimizer optimizer(adamw, pg);
//   loss.backward();
//   optimizer.step();
//   optimizer.zero_grad();
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "tandem/comm/process_group.h"
#include "tandem/zero/distributed_optimizer.h"

namespace tandem::zero {

class ShardedOptimizer : public DistributedOptimizer {
 public:
  /// Takes the parameters this rank does not own out of `optimizer`'s param groups for good and
  /// drops their state; `optimizer` must outlive this object (which never touches it when it goes).
  /// Throws tandem::Error for an optimizer that needs every parameter in its step (LBFGS).
  ShardedOptimizer(torch::optim::Optimizer& optimizer, std::shared_ptr<comm::ProcessGroup> pg);
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  /// Steps this rank's parameters, then gives every rank every owner's update, and drops the
  /// gradients of the parameters others own. Collective: every rank calls it. Throws tandem::Error
  /// (before anything changes) for sparse gradients or when the optimizer's param groups changed
  /// since construction, and on every rank when one rank's step failed.
  void step();
  /// The same, stepping the sharded optimizer through `stepper` (e.g. a GradScaler's step, which
  /// unscales and may skip): the updates are exchanged when it returns true. Every rank must
  /// return the same (checked: a disagreement or a failure throws on every rank). Returns it.
  bool step(const Stepper& stepper) override;
  /// Drops the gradients of every parameter, owned or not.
  void zero_grad() override { zero_grad(/*set_to_none=*/true); }
  /// Zeroes (or drops) the gradients of every parameter, owned or not.
  void zero_grad(bool set_to_none);
  /// zero::clip_grad_norm with this optimizer: each gradient counted on its owner (collective).
  double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0) override;
  StateLayout state_layout() const override { return StateLayout::ByParameter; }

  /// The owner of parameter `index` of group `group` (the optimizer's order at construction).
  int owner(size_t group, size_t index) const { return owners_.at(group).at(index); }
  /// The owner of `param`, or -1 when it is none of this optimizer's parameters.
  int owner_of(const at::Tensor& param) const override;
  /// Every parameter of the groups, owned or not, as given at construction.
  const std::vector<std::vector<at::Tensor>>& all_params() const override { return all_; }
  /// How many elements each rank owns.
  std::vector<int64_t> owned_numel() const;
  torch::optim::Optimizer& optimizer() override { return optimizer_; }
  comm::ProcessGroup& process_group() { return *pg_; }

 private:
  void sync_parameters();

  torch::optim::Optimizer& optimizer_;
  std::shared_ptr<comm::ProcessGroup> pg_;
  std::vector<std::vector<at::Tensor>> all_;     // per group, every parameter
  std::vector<std::vector<int>> owners_;         // per group, each parameter's owner
  std::vector<std::vector<at::Tensor>> owned_;   // per group, this rank's parameters (what the optimizer holds)
  std::vector<std::vector<at::Tensor>> by_rank_; // per rank, its parameters in group order
  std::unordered_map<const void*, int> owner_by_impl_;
};

}  // namespace tandem::zero
