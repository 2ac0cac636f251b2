#pragma once
// An optimizer whose parameters are this rank's pieces of the model's parameters: ZeRO-2's flat
// slices (zero::GradientShardedOptimizer) and FSDP's row shards (fsdp::FsdpOptimizer). What the
// Accelerator needs to step, clip and checkpoint either, whole parameter by whole parameter.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

namespace tandem::zero {

class PartitionedOptimizer {
 public:
  using NamedState = std::vector<std::pair<std::string, at::Tensor>>;
  using StateOf = std::function<const torch::optim::OptimizerParamState*(const at::Tensor&)>;
  using BuiltState = std::vector<std::unique_ptr<torch::optim::OptimizerParamState>>;

  virtual ~PartitionedOptimizer() = default;
  /// Steps this rank's pieces through `stepper` (e.g. a GradScaler's step); every rank agrees
  /// to step or skip (checked). Returns whether it stepped. Collective.
  virtual bool step(const std::function<bool(torch::optim::Optimizer&)>& stepper) = 0;
  virtual void zero_grad() = 0;
  /// torch.nn.utils.clip_grad_norm_ over `parameters` (the model's, whole, as given to it
  /// unsharded): the norm of every rank's pieces of them, the same on every rank, and those
  /// pieces clipped. Throws tandem::Error for a parameter that needs a gradient and that this
  /// optimizer holds no piece of. Collective: every rank gives the same parameters.
  virtual double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm,
                                double norm_type = 2.0) = 0;
  /// The model's parameters per param group, whole, as the optimizer was given them.
  virtual const std::vector<std::vector<at::Tensor>>& all_params() const = 0;
  /// Checkpoints: every parameter's state, whole and shaped like it ((key, tensor) as
  /// zero::state_tensors gives them). Collective; every rank gets all of it. Parameters without
  /// state yet are left out.
  virtual std::vector<std::pair<at::Tensor, NamedState>> gather_state() = 0;
  /// Checkpoints: this rank's pieces' state built from each parameter's staged state (`state_of`,
  /// null when none: whole, or, for FsdpOptimizer, only this rank's rows), checked but not
  /// installed (throws tandem::Error).
  virtual BuiltState build_state(const StateOf& state_of) const = 0;
  /// Replaces the pieces' state by what build_state made (does not throw for its result).
  virtual void install_state(BuiltState built) = 0;
};

}  // namespace tandem::zero
