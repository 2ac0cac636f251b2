#pragma once
// Accounted memory of model state, for `tandem bench` and ZeRO's docs: what a rank holds by
// kind, counted from the tensors themselves (not RSS).
#include <cstdint>

#include <torch/optim/optimizer.h>

namespace tandem::zero {

/// Bytes of the optimizer's per-parameter state (momentum buffers, Adam's moments, ...) for
/// LibTorch's SGD, Adam, AdamW, RMSprop and Adagrad; throws tandem::Error for another type's state.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace tandem::zero
