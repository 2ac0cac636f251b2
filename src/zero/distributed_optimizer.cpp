#include "tandem/zero/distributed_optimizer.h"

#include "tandem/zero/clip_grad_norm.h"

namespace tandem::zero {

WholeOptimizer::WholeOptimizer(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  for (const auto& group : optimizer.param_groups()) groups_.push_back(group.params());
}

double WholeOptimizer::clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  // Every rank holds every gradient whole and the same: torch's norm, no collective.
  GradientPieces pieces;
  for (const auto& p : parameters) pieces.add(p.grad(), true, p);
  return zero::clip_grad_norm(pieces, nullptr, max_norm, norm_type);
}

}  // namespace tandem::zero
