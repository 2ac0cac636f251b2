#pragma once
// What both ZeRO stages check around a step of the optimizer they shard in place.
#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "tandem/comm/process_group.h"

namespace tandem::zero {

/// Runs `step` (true: stepped, false: skipped) and makes every rank agree: the outcome is
/// all-reduced, and a step that threw or disagreed on any rank throws tandem::Error on every rank.
/// Returns whether every rank stepped. Collective.
bool agreed_step(comm::ProcessGroup& pg, const std::function<bool()>& step);

/// Throws tandem::Error (naming `who`, the sharding class) unless `optimizer`'s param groups hold
/// exactly `expected`, the tensors the sharding left there.
void check_groups_unchanged(const torch::optim::Optimizer& optimizer,
                            const std::vector<std::vector<at::Tensor>>& expected, const char* who);

}  // namespace tandem::zero
