#pragma once
// clip_grad_norm_ when optimizers are sharded (ZeRO-1): a parameter a ShardedOptimizer holds
// counts on the rank that owns it (the others may not have unscaled its gradient: a GradScaler
// unscales the optimizer's own parameters), any other parameter on rank 0 (its gradient is the
// same everywhere). Each parameter's norm is computed where it counts and summed over ranks with
// exact zeros from the others, then combined as torch::nn::utils::clip_grad_norm_ does, so every
// rank returns unsharded's total norm, bit for bit, and the clip scales the owned gradients and
// the unsharded ones by unsharded's coefficient. Without sharded optimizers it is that function.
#include <vector>

#include <ATen/ATen.h>

#include "tandem/comm/process_group.h"
#include "tandem/zero/distributed_optimizer.h"

namespace tandem::zero {

/// The total norm of the gradients of `parameters`, as if nothing were sharded, and the clip.
/// `sharded`: the optimizers whose owner_of() places a parameter's gradient (ZeRO-1's); a
/// parameter none of them owns counts on rank 0.
double clip_grad_norm(const std::vector<at::Tensor>& parameters, const std::vector<const DistributedOptimizer*>& sharded,
                      comm::ProcessGroup& pg, double max_norm, double norm_type = 2.0);

/// The same when every rank holds disjoint pieces of the gradients (ZeRO-2's slices, FSDP's
/// shards): `grads` are this rank's pieces; their norms are summed over ranks (in double, one
/// all-reduce), and every piece is scaled by torch's coefficient. Returns the total norm, the
/// same on every rank. Collective.
double clip_sharded_grad_norm(const std::vector<at::Tensor>& grads, comm::ProcessGroup& pg, double max_norm,
                              double norm_type = 2.0);
/// The same when some pieces have copies on other ranks (tensor parallelism's whole parameters, DDP's
/// replicas): only the pieces with `counted` true enter the norm (one copy of each piece over the
/// group), and every piece is scaled.
double clip_grad_norm_of_pieces(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted,
                                comm::ProcessGroup& pg, double max_norm, double norm_type = 2.0);

}  // namespace tandem::zero
