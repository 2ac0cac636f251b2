#pragma once
// DistributedOptimizer: one optimizer as a data-parallel strategy holds it, and what the
// Accelerator needs to step, clip and checkpoint it, whatever the strategy (Note [One optimizer
// interface]):
//   WholeOptimizer             every rank steps every parameter (one process, DDP, DataParallel)
//   zero::ShardedOptimizer     ZeRO-1: each rank steps and keeps state for the parameters it owns
//   zero::GradientShardedOptimizer  ZeRO-2: flat slices of parameters, gradients and state
//   fsdp::FsdpOptimizer        FSDP: dim-0 rows of every parameter
// The last two are PartitionedOptimizers: their parameters are pieces of the model's.
//
// Note [One optimizer interface]
// The Accelerator keeps one DistributedOptimizer per prepared optimizer and calls it; it never
// asks which strategy made it. Where checkpoints must know how the state is spread over the
// ranks, state_layout() says so, and a partitioned optimizer gives its pieces' state through
// partitioned() (a virtual, not a cast).
#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

namespace tandem::zero {

class PartitionedOptimizer;

class DistributedOptimizer {
 public:
  using Stepper = std::function<bool(torch::optim::Optimizer&)>;
  /// How the optimizer's state lies across the ranks, as a checkpoint writes it.
  enum class StateLayout {
    /// Every rank holds all of it (or can gather it whole): the main process writes one file.
    Whole,
    /// Each rank holds the whole state of some parameters (owner_of): a file per rank.
    ByParameter,
    /// Each rank holds dim-0 rows of every parameter's state: a file per rank (Note [Sharded files]).
    ByRows,
  };

  virtual ~DistributedOptimizer() = default;
  /// The caller's LibTorch optimizer (changed in place by sharding strategies).
  virtual torch::optim::Optimizer& optimizer() = 0;
  /// Steps through `stepper` (a plain step, or a GradScaler's, which may skip); every rank agrees
  /// to step or skip. Returns whether it stepped. Collective for the sharded strategies.
  virtual bool step(const Stepper& stepper) = 0;
  /// Drops every parameter's gradient (the pieces' under ZeRO-2 and FSDP).
  virtual void zero_grad() = 0;
  /// torch.nn.utils.clip_grad_norm_ over `parameters` (the model's, whole, as given unsharded):
  /// the same norm on every rank, and the gradients clipped. Collective for the sharded ones.
  virtual double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm,
                                double norm_type = 2.0) = 0;
  /// The model's parameters per param group, whole, as the optimizer was given them.
  virtual const std::vector<std::vector<at::Tensor>>& all_params() const = 0;
  virtual StateLayout state_layout() const = 0;
  /// ByParameter: the rank whose state holds `param`; -1 for a parameter every rank holds (or
  /// none of this optimizer's).
  virtual int owner_of(const at::Tensor& param) const {
    (void)param;
    return -1;
  }
  /// ZeRO-2 and FSDP: this object as a PartitionedOptimizer (its pieces' state is built and
  /// installed there, not in optimizer()); null for the others.
  virtual PartitionedOptimizer* partitioned() { return nullptr; }
};

/// The unsharded optimizer: every rank steps every parameter (their gradients already agree).
class WholeOptimizer : public DistributedOptimizer {
 public:
  /// `optimizer` must outlive this object.
  explicit WholeOptimizer(torch::optim::Optimizer& optimizer);
  torch::optim::Optimizer& optimizer() override { return optimizer_; }
  bool step(const Stepper& stepper) override { return stepper(optimizer_); }
  void zero_grad() override { optimizer_.zero_grad(); }
  double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0) override;
  const std::vector<std::vector<at::Tensor>>& all_params() const override { return groups_; }
  StateLayout state_layout() const override { return StateLayout::Whole; }

 private:
  torch::optim::Optimizer& optimizer_;
  std::vector<std::vector<at::Tensor>> groups_;
};

}  // namespace tandem::zero
