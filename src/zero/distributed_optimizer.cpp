#include "tandem/zero/distributed_optimizer.h"

#include <torch/nn/utils/clip_grad.h>

namespace tandem::zero {

WholeOptimizer::WholeOptimizer(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  for (const auto& group : optimizer.param_groups()) groups_.push_back(group.params());
}

double WholeOptimizer::clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
}

}  // namespace tandem::zero
