#include "tandem/zero/clip_grad_norm.h"

#include <cmath>
#include <limits>
#include <optional>

#include <torch/nn/utils/clip_grad.h>

#include "tandem/error.h"

namespace tandem::zero {

double clip_grad_norm(const std::vector<at::Tensor>& parameters, const std::vector<const ShardedOptimizer*>& sharded,
                      comm::ProcessGroup& pg, double max_norm, double norm_type) {
  if (sharded.empty()) return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
  // torch::nn::utils::clip_grad_norm_, step for step, except that each parameter's norm is taken
  // where it counts and the others contribute an exact zero: the sum over ranks is then each
  // norm itself, and the total, the coefficient and the clipped gradients are unsharded's bits.
  std::vector<at::Tensor> clipped, norms;
  const bool infinity = norm_type == std::numeric_limits<double>::infinity();  // torch's special case (not -inf)
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    const at::Tensor g = p.grad().detach();
    int owner = -1;
    for (const ShardedOptimizer* s : sharded) {
      if ((owner = s->owner_of(p)) >= 0) break;
    }
    if (owner == pg.rank() || owner < 0) clipped.push_back(g);
    const bool counted = owner == pg.rank() || (owner < 0 && pg.rank() == 0);
    if (!counted) {
      norms.push_back(at::zeros({}, g.options()));
    } else {
      norms.push_back(infinity ? g.abs().max() : g.norm(norm_type));
    }
  }
  if (norms.empty()) return 0.0;
  at::Tensor each = at::stack(norms);
  pg.all_reduce(each, comm::ReduceOp::Sum);
  at::Tensor total;
  if (norm_type == 0) {
    total = at::full({}, static_cast<double>(norms.size()));
  } else if (norms.size() == 1) {
    total = each[0];
  } else {
    total = infinity ? each.max() : each.norm(norm_type);
  }
  const at::Tensor coefficient = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  at::NoGradGuard no_grad;
  for (auto& g : clipped) g.mul_(coefficient);
  return total.item<double>();
}

}  // namespace tandem::zero
