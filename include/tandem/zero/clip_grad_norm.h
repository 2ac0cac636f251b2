#pragma once
// clip_grad_norm_ over gradients however they lie across the processes: whole on every process
// (DDP), whole where each counts (ZeRO-1's owners), or cut into pieces (ZeRO-2's flat slices,
// FSDP's rows, tensor parallelism's parts, pipeline stages' parameters). Every strategy's clip is this one
// function; the strategies only say which piece of which gradient each process holds and whether
// its copy counts (comm::Layout::counts).
//
// Note [One norm over pieces]
// The total norm a process returns is the one torch::nn::utils::clip_grad_norm_ would return on the
// whole gradients, and there are two numerics, chosen by the job's layouts, never by what one
// process holds (so every process enters the same collective):
// - Nothing cut (`cut` false): each gradient is whole where it counts, so its norm is taken
//   there by torch's own kernel, and exact zeros elsewhere. One all-reduce sums the norms (each
//   then is that norm itself) with a flag per tensor saying whether it has a gradient, and they
//   are combined as torch combines them: the total, the coefficient and the clipped gradients are
//   torch's bits. Without a process group (every process holds every gradient whole and the
//   same), this is torch's function, with no collective.
// - The model cut: a tensor's norm is a sum over processes, which no single kernel computes (and
//   pipeline stages list different tensors, so per-tensor slots would not line up). |g|^p is summed in double over the pieces that count, in order (one host sync for the whole
//   norm, not one per gradient), one all-reduce over the processes, then the root; the
//   coefficient is torch's formula in float. The double sum rounds once where float sums of
//   pieces would round per piece.
// Every defined gradient given is scaled by the coefficient (under the first numerics, those of
// tensors that have a gradient somewhere): a piece that does not count is still a copy to clip.
#include <vector>

#include <ATen/ATen.h>

#include "tandem/comm/process_group.h"

namespace tandem::zero {

/// The gradients a norm is taken over, as this process holds them.
struct GradientPieces {
  struct Piece {
    at::Tensor grad;              // undefined: none here (nothing counted, nothing clipped)
    bool counts = false;          // this copy enters the norm (one copy of each piece over the job)
    at::TensorOptions options;    // the parameter's: where a process without the gradient puts its zero
  };
  /// One entry per tensor (not cut) or per piece (cut), in the order torch would see the
  /// parameters; not cut, every process lists the same tensors.
  std::vector<Piece> pieces;
  /// Whether the model is cut into pieces across the processes (a tensor cut, or the tensors split
  /// between pipeline stages): the same on every process (Note [One norm over pieces]).
  bool cut = false;

  /// `grad` (undefined or not) of `param`, counted here or not.
  void add(at::Tensor grad, bool counts_here, const at::Tensor& param) {
    pieces.push_back({std::move(grad), counts_here, param.options()});
  }
};

/// The total norm of the gradients, the same on every process, and every given gradient scaled by
/// min(1, max_norm / (norm + 1e-6)). `pg`: the processes the pieces are spread over; null when
/// every process holds every gradient whole and the same (then no collective). Collective over
/// `pg` otherwise, whatever this process holds.
double clip_grad_norm(const GradientPieces& pieces, comm::ProcessGroup* pg, double max_norm, double norm_type = 2.0);

/// ZeRO-1's rule for one parameter's gradient: it counts on its owner (the other processes may not
/// have unscaled it: a GradScaler unscales an optimizer's own parameters) and is clipped there;
/// a parameter no optimizer owns (`owner` -1) is the same everywhere, counted on rank 0 and
/// clipped everywhere.
void add_owned_gradient(GradientPieces& pieces, const at::Tensor& param, int owner, int rank);

}  // namespace tandem::zero
