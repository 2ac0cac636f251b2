#pragma once
// Choosing the units (accelerate's auto-wrap policies, PyTorch's ModuleWrapPolicy and
// size_based_auto_wrap_policy): entries of torch::nn::Sequential become tandem::fsdp::Unit in
// place, so the Sequential's forward runs them through their unit. Only Sequential entries can
// be wrapped from outside: a module of your own calls its children through its own members, which
// only it can point at a Unit (unit.h).
#include <cstddef>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include "tandem/fsdp/auto_wrap_policy.h"

namespace tandem::fsdp {

/// Every entry of `sequential` the policy picks becomes a Unit. Returns how many.
size_t wrap_entries(torch::nn::SequentialImpl& sequential, const AutoWrapPolicy& policy = {});
/// wrap_entries on every Sequential under `root` (itself included), top down: an entry that becomes
/// a unit is not looked into. Returns how many units it made.
size_t auto_wrap(torch::nn::Module& root, const AutoWrapPolicy& policy = {});

}  // namespace tandem::fsdp
