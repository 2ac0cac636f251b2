#include "tandem/zero/clip_grad_norm.h"

#include <cmath>
#include <limits>
#include <optional>

#include <torch/nn/utils/clip_grad.h>

#include "tandem/error.h"

namespace tandem::zero {

double clip_grad_norm(const std::vector<at::Tensor>& parameters, const std::vector<const DistributedOptimizer*>& sharded,
                      comm::ProcessGroup& pg, double max_norm, double norm_type) {
  if (sharded.empty()) return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
  // torch::nn::utils::clip_grad_norm_, step for step, except that each parameter's norm is taken
  // where it counts and the others contribute an exact zero: the sum over ranks is then each
  // norm itself, and the total, the coefficient and the clipped gradients are unsharded's bits.
  // A parameter counts when it has a gradient where it counts. Every rank sends a slot per
  // parameter, and whether it counts there, in one all-reduce, whatever gradients it holds: a
  // rank with none enters the same collective as the others.
  if (parameters.empty()) return 0.0;
  const int64_t n = static_cast<int64_t>(parameters.size());
  std::vector<at::Tensor> mine(parameters.size()), norms;  // mine: this rank's gradients to clip
  at::Tensor counts_here = at::zeros({n});
  const bool infinity = norm_type == std::numeric_limits<double>::infinity();  // torch's special case (not -inf)
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& p = parameters[static_cast<size_t>(i)];
    const at::Tensor g = p.grad().defined() ? p.grad().detach() : at::Tensor();
    int owner = -1;
    for (const DistributedOptimizer* s : sharded) {
      if ((owner = s->owner_of(p)) >= 0) break;
    }
    if (g.defined() && (owner == pg.rank() || owner < 0)) mine[static_cast<size_t>(i)] = g;
    const bool counted = g.defined() && (owner == pg.rank() || (owner < 0 && pg.rank() == 0));
    norms.push_back(!counted ? at::zeros({}, (g.defined() ? g : p).options()) : infinity ? g.abs().max() : g.norm(norm_type));
    if (counted) counts_here[i] = 1;
  }
  at::Tensor stacked = at::stack(norms);
  // The flags go where the norms are (a CUDA model's all-reduce is NCCL's, on its device).
  at::Tensor both = at::cat({stacked, counts_here.to(stacked.options())});
  pg.all_reduce(both, comm::ReduceOp::Sum);
  const at::Tensor present = both.narrow(0, n, n).gt(0);
  const at::Tensor each = both.narrow(0, 0, n).index_select(0, present.nonzero().view({-1}));
  const int64_t with_grad = each.numel();
  if (with_grad == 0) return 0.0;  // torch: no gradient, nothing clipped
  at::Tensor total;
  if (norm_type == 0) {
    total = at::full({}, static_cast<double>(with_grad));
  } else if (with_grad == 1) {
    total = each[0];
  } else {
    total = infinity ? each.max() : each.norm(norm_type);
  }
  const at::Tensor coefficient = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  at::NoGradGuard no_grad;
  const at::Tensor present_here = present.cpu();  // one host sync, not one per parameter
  const bool* counts = present_here.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {
    if (mine[static_cast<size_t>(i)].defined() && counts[i]) mine[static_cast<size_t>(i)].mul_(coefficient);
  }
  return total.item<double>();
}

double clip_sharded_grad_norm(const std::vector<at::Tensor>& grads, comm::ProcessGroup& pg, double max_norm,
                              double norm_type) {
  return clip_grad_norm_of_pieces(grads, std::vector<bool>(grads.size(), true), pg, max_norm, norm_type);
}

double clip_grad_norm_of_pieces(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted,
                                comm::ProcessGroup& pg, double max_norm, double norm_type) {
  TANDEM_CHECK(counted.size() == grads.size(), "clip_grad_norm: ", counted.size(), " flags for ", grads.size(),
               " gradients");
  at::NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  // Accumulated in double on the gradients' device, in order, as the host once did (the same
  // sums, the same NaN): one host sync for the whole norm, not one per gradient.
  c10::Device device(c10::kCPU);
  for (const auto& g : grads) {
    if (g.defined()) {
      device = g.device();
      break;
    }
  }
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    if (!counted[i] || !g.defined() || g.numel() == 0) continue;
    if (inf) {
      total = at::maximum(total, g.abs().max().to(at::kDouble).view({1}));  // NaN propagates
    } else {
      total = total + g.to(at::kDouble).abs().pow(norm_type).sum().view({1});
    }
  }
  pg.all_reduce(total, inf ? comm::ReduceOp::Max : comm::ReduceOp::Sum);
  const double reduced = total.item<double>();
  const double norm = inf ? reduced : std::pow(reduced, 1.0 / norm_type);
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
