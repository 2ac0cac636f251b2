#pragma once
// Loss parallelism: cross entropy over logits whose classes (the vocabulary) are sharded over the
// tensor-parallel group, without ever gathering them (PyTorch's loss_parallel(), Megatron's
// vocab-parallel cross entropy). Each rank holds the logits of classes
// [rank * V/n, (rank + 1) * V/n); the row maxima and the sums of exponentials are all-reduced, and
// so is the logit of each target, picked by the rank that holds it.
//
//   at::Tensor logits = head(h);                          // ColwiseParallel head: [B, T, V/n]
//   at::Tensor loss = tandem::tp::cross_entropy(logits, targets, tp_group);
//   loss.backward();                                      // gradients for this rank's classes only
//
// The result equals at::cross_entropy_loss on the whole logits (the class dimension last here;
// targets shaped as the logits less that dimension, the same on every rank): ignore_index's
// targets count for nothing, and Mean divides by the number of the others (0 of them: NaN, as
// PyTorch). Half and bfloat16 logits are computed in float32, the loss returned in their dtype.
#include <cstdint>

#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "tandem/tp/functional.h"

namespace tandem::tp {

struct CrossEntropyOptions {
  TORCH_ARG(int64_t, ignore_index) = -100;
  TORCH_ARG(at::Reduction::Reduction, reduction) = at::Reduction::Mean;
};

/// Cross entropy of `local_logits` ([..., V/n], this rank's classes) against `target` ([...],
/// class indices in [0, V)). Collective over `group`. One-line tandem::Error for a target out of
/// range or shapes that do not match.
at::Tensor cross_entropy(const at::Tensor& local_logits, const at::Tensor& target, const Group& group,
                         const CrossEntropyOptions& options = {});

}  // namespace tandem::tp
