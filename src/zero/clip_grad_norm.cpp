#include "tandem/zero/clip_grad_norm.h"

#include <cmath>
#include <limits>
#include <optional>


namespace tandem::zero {
namespace {

// Note [One norm over pieces], no tensor cut: torch::nn::utils::clip_grad_norm_ step for step,
// each norm taken where it counts.
double clip_whole(const GradientPieces& pieces, comm::ProcessGroup* pg, double max_norm, double norm_type) {
  const int64_t n = static_cast<int64_t>(pieces.pieces.size());
  if (n == 0) return 0.0;
  const bool infinity = norm_type == std::numeric_limits<double>::infinity();  // torch's special case (not -inf)
  std::vector<at::Tensor> norms;
  at::Tensor counts_here = at::zeros({n});
  for (int64_t i = 0; i < n; ++i) {
    const auto& piece = pieces.pieces[static_cast<size_t>(i)];
    const bool counted = piece.grad.defined() && (piece.counts || !pg);
    if (!counted && !pg) continue;  // torch skips a parameter without a gradient
    const at::Tensor g = counted ? piece.grad.detach() : at::Tensor();
    norms.push_back(!counted ? at::zeros({}, piece.grad.defined() ? piece.grad.options() : piece.options)
                    : infinity ? g.abs().max()
                               : g.norm(norm_type));
    if (counted) counts_here[i] = 1;
  }
  if (norms.empty()) return 0.0;  // torch: no gradient, nothing clipped
  at::Tensor present, each;
  if (pg) {
    // Every process's slot for every tensor, in one all-reduce with the flags, which go where the
    // norms are (a CUDA model's all-reduce is NCCL's, on its device).
    const at::Tensor stacked = at::stack(norms);
    at::Tensor both = at::cat({stacked, counts_here.to(stacked.options())});
    pg->all_reduce(both, comm::ReduceOp::Sum);
    present = both.narrow(0, n, n).gt(0);
    each = both.narrow(0, 0, n).index_select(0, present.nonzero().view({-1}));
  } else {
    present = counts_here.gt(0);
    each = at::stack(norms);
  }
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
  const at::Tensor present_here = present.cpu();  // one host sync, not one per gradient
  const bool* has = present_here.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& g = pieces.pieces[static_cast<size_t>(i)].grad;
    if (g.defined() && has[i]) g.detach().mul_(coefficient);
  }
  return total.item<double>();
}

// Note [One norm over pieces], some tensor cut: the p-th powers summed in double.
double clip_cut(const GradientPieces& pieces, comm::ProcessGroup* pg, double max_norm, double norm_type) {
  at::NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  // On the gradients' device (a process holding none of them: its parameters'), so that every
  // process's all-reduce is on the same kind of device.
  c10::Device device = pieces.pieces.empty() ? c10::Device(c10::kCPU) : pieces.pieces.front().options.device();
  for (const auto& piece : pieces.pieces) {
    if (piece.grad.defined()) {
      device = piece.grad.device();
      break;
    }
  }
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& piece : pieces.pieces) {
    const at::Tensor& g = piece.grad;
    if (!piece.counts || !g.defined() || g.numel() == 0) continue;
    if (inf) {
      total = at::maximum(total, g.abs().max().to(at::kDouble).view({1}));  // NaN propagates
    } else {
      total = total + g.to(at::kDouble).abs().pow(norm_type).sum().view({1});
    }
  }
  if (pg) pg->all_reduce(total, inf ? comm::ReduceOp::Max : comm::ReduceOp::Sum);
  const double reduced = total.item<double>();
  const double norm = inf ? reduced : std::pow(reduced, 1.0 / norm_type);
  // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, every gradient multiplied.
  // NaN propagates as in torch (clamp keeps NaN; std::min would not).
  const double raw = max_norm / (static_cast<double>(static_cast<float>(norm)) + 1e-6);
  const float coef = static_cast<float>(std::isnan(raw) ? raw : std::min(1.0, raw));
  for (const auto& piece : pieces.pieces) {
    if (piece.grad.defined()) piece.grad.detach().mul_(coef);
  }
  return static_cast<float>(norm);
}

}  // namespace

double clip_grad_norm(const GradientPieces& pieces, comm::ProcessGroup* pg, double max_norm, double norm_type) {
  return pieces.cut ? clip_cut(pieces, pg, max_norm, norm_type) : clip_whole(pieces, pg, max_norm, norm_type);
}

void add_owned_gradient(GradientPieces& pieces, const at::Tensor& param, int owner, int rank) {
  const at::Tensor& g = param.grad();
  const bool here = g.defined() && (owner == rank || owner < 0);
  pieces.add(here ? g : at::Tensor(), g.defined() && (owner == rank || (owner < 0 && rank == 0)), param);
}

}  // namespace tandem::zero
