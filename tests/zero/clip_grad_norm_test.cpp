// zero::clip_grad_norm (Note [One norm over pieces]) against answers computed here from the whole
// gradients, at every process count this binary runs with (1 to 4): where nothing is cut, the
// norm and the clipped gradients are torch::nn::utils::clip_grad_norm_'s bit for bit, however the
// copies that count are spread (every process, one per tensor, ZeRO-1's owners); where tensors
// are cut (uneven rows, a process with an empty piece) they are the double-accumulated sum of the
// whole gradients, bit for bit, with torch's coefficient.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <torch/nn/utils/clip_grad.h>
#include <torch/torch.h>

#include "support/distributed_main.h"
#include "tandem/comm/layout.h"
#include "tandem/comm/placement.h"
#include "tandem/zero/clip_grad_norm.h"

using tandem::comm::Placement;
using tandem::test::pg;
using tandem::zero::GradientPieces;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// The whole gradients, the same on every process: a 0-d one, uneven rows, one without a gradient,
// a one-row one (cut, only the first process holds it), and a small one.
struct Whole {
  std::vector<at::Tensor> params, grads;
};

Whole whole_gradients() {
  torch::manual_seed(11);
  Whole w;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{}, {7, 5}, {3}, {1, 4}, {9}}) {
    w.params.push_back(torch::zeros(shape));
    w.grads.push_back(torch::randn(shape) * (1.0 + static_cast<double>(w.grads.size())));
  }
  w.grads[2] = at::Tensor();      // no gradient: torch skips it
  w.grads[4] = w.grads[4] * 1e-3;  // a small one beside large ones
  return w;
}

// torch's clip on copies of the whole gradients: the norm, and the clipped gradients.
std::pair<double, std::vector<at::Tensor>> torch_clip(const Whole& w, double max_norm, double norm_type) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < w.params.size(); ++i) {
    at::Tensor p = w.params[i].clone();
    if (w.grads[i].defined()) p.mutable_grad() = w.grads[i].clone();
    params.push_back(p);
  }
  const double norm = torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type);
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  return {norm, grads};
}

std::vector<double> norm_types() { return {2.0, 1.0, 3.0, kInf, 0.0}; }

// A max_norm that clips: half the norm.
double half_the_norm(const Whole& w, double norm_type) { return torch_clip(w, 1e30, norm_type).first / 2; }

void expect_torch(const Whole& w, const GradientPieces& pieces, tandem::comm::ProcessGroup* group, double norm_type,
                  const std::vector<bool>& clipped_here) {
  const double max_norm = half_the_norm(w, norm_type);
  const auto [expected, clipped] = torch_clip(w, max_norm, norm_type);
  EXPECT_EQ(tandem::zero::clip_grad_norm(pieces, group, max_norm, norm_type), expected) << "norm " << norm_type;
  for (size_t i = 0; i < w.grads.size(); ++i) {
    const at::Tensor& mine = pieces.pieces[i].grad;
    if (!clipped_here[i]) continue;
    ASSERT_TRUE(mine.defined()) << i;
    EXPECT_TRUE(at::equal(mine, clipped[i])) << "tensor " << i << ", norm " << norm_type;
  }
}

std::vector<at::Tensor> copies(const Whole& w) {
  std::vector<at::Tensor> out;
  for (const auto& g : w.grads) out.push_back(g.defined() ? g.clone() : at::Tensor());
  return out;
}

}  // namespace

// Every process holds every gradient (DDP): no collective, torch's function.
TEST(ClipGradNorm, WholeEverywhereIsTorchBitForBit) {
  const Whole w = whole_gradients();
  for (double norm_type : norm_types()) {
    GradientPieces pieces;
    const auto grads = copies(w);
    for (size_t i = 0; i < grads.size(); ++i) pieces.add(grads[i], false, w.params[i]);  // counts ignored: no group
    std::vector<bool> clipped;
    for (const auto& g : grads) clipped.push_back(g.defined());
    expect_torch(w, pieces, nullptr, norm_type, clipped);
  }
}

// Each tensor counts on one process (i mod the processes), every process holds and clips a copy.
TEST(ClipGradNorm, WholeCountedOnOneProcessIsTorchBitForBit) {
  const Whole w = whole_gradients();
  for (double norm_type : norm_types()) {
    GradientPieces pieces;
    const auto grads = copies(w);
    for (size_t i = 0; i < grads.size(); ++i) {
      pieces.add(grads[i], static_cast<int>(i) % pg().size() == pg().rank(), w.params[i]);
    }
    std::vector<bool> clipped;
    for (const auto& g : grads) clipped.push_back(g.defined());
    expect_torch(w, pieces, &pg(), norm_type, clipped);
  }
}

// ZeRO-1: a gradient is kept (and clipped) on its owner only, one tensor by no owner (everywhere).
TEST(ClipGradNorm, OwnedGradientsAreTorchBitForBit) {
  const Whole w = whole_gradients();
  for (double norm_type : norm_types()) {
    GradientPieces pieces;
    std::vector<bool> clipped;
    for (size_t i = 0; i < w.grads.size(); ++i) {
      const int owner = i == 1 ? -1 : static_cast<int>(i + 1) % pg().size();
      at::Tensor p = w.params[i].clone();
      if (w.grads[i].defined() && (owner < 0 || owner == pg().rank())) p.mutable_grad() = w.grads[i].clone();
      tandem::zero::add_owned_gradient(pieces, p, owner, pg().rank());
      clipped.push_back(p.grad().defined());
    }
    expect_torch(w, pieces, &pg(), norm_type, clipped);
  }
}

// Cut: rows of every tensor over the processes (uneven; a one-row tensor leaves the others an
// empty piece), the 0-d one whole and counted once. The norm is the sum of |g|^p over the whole
// gradients in double, its root, as float; each piece is its rows of g times torch's coefficient.
TEST(ClipGradNorm, CutIsTheDoubleSumOfTheWholeBitForBit) {
  const Whole w = whole_gradients();
  const int64_t n = pg().size();
  for (double norm_type : {2.0, 1.0, 3.0, kInf}) {
    double sum = 0;
    for (const auto& g : w.grads) {
      if (!g.defined()) continue;
      const at::Tensor d = g.to(at::kDouble).abs();
      sum = std::isinf(norm_type) ? std::max(sum, d.max().item<double>()) : sum + d.pow(norm_type).sum().item<double>();
    }
    const double root = std::isinf(norm_type) ? sum : std::pow(sum, 1.0 / norm_type);
    const double max_norm = root / 2;
    const float coefficient =
        static_cast<float>(std::min(1.0, max_norm / (static_cast<double>(static_cast<float>(root)) + 1e-6)));

    GradientPieces pieces;
    pieces.cut = true;
    std::vector<tandem::comm::Chunk> boxes;
    for (size_t i = 0; i < w.grads.size(); ++i) {
      const auto shape = w.params[i].sizes().vec();
      const bool zero_dim = shape.empty();
      const auto layout = tandem::comm::make_layout({"shard"}, {n}, {pg().rank()},
                                                    {zero_dim ? Placement::replicate() : Placement::shard(0)}, shape);
      boxes.push_back(layout.chunk);
      at::Tensor mine;
      if (w.grads[i].defined()) mine = zero_dim ? w.grads[i].clone() : tandem::comm::narrow_to(w.grads[i], layout.chunk).clone();
      pieces.add(mine, layout.counts(), w.params[i]);
    }
    EXPECT_EQ(tandem::zero::clip_grad_norm(pieces, &pg(), max_norm, norm_type), static_cast<float>(root))
        << "norm " << norm_type;
    for (size_t i = 0; i < w.grads.size(); ++i) {
      if (!w.grads[i].defined()) continue;
      const at::Tensor expected = w.grads[i] * coefficient;
      const at::Tensor mine = pieces.pieces[i].grad;
      EXPECT_TRUE(at::equal(mine, mine.dim() == 0 ? expected : tandem::comm::narrow_to(expected, boxes[i])))
          << "tensor " << i << ", norm " << norm_type;
    }
  }
}
