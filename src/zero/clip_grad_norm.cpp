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

double clip_sharded_grad_norm(const std::vector<at::Tensor>& grads, comm::ProcessGroup& pg, double max_norm,
                              double norm_type) {
  at::NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  double local = 0;
  for (const auto& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    if (inf) {
      const double m = g.abs().max().item<double>();
      local = std::isnan(m) || std::isnan(local) ? std::nan("") : std::max(local, m);
    } else {
      local += g.to(at::kDouble).abs().pow(norm_type).sum().item<double>();
    }
  }
  at::Tensor total = at::full({1}, local, at::kDouble);
  pg.all_reduce(total, inf ? comm::ReduceOp::Max : comm::ReduceOp::Sum);
  const double norm = inf ? total.item<double>() : std::pow(total.item<double>(), 1.0 / norm_type);
  // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, every gradient multiplied.
  // NaN propagates as in torch (clamp keeps NaN; std::min would not).
  const double raw = max_norm / (static_cast<double>(static_cast<float>(norm)) + 1e-6);
  const float coef = static_cast<float>(std::isnan(raw) ? raw : std::min(1.0, raw));
  for (const auto& g : grads) {
    if (g.defined()) g.mul_(coef);
  }
  return static_cast<float>(norm);
}

}  // namespace tandem::zero
