#pragma once
// What save_state and load_state agree on (the Accelerator's checkpoints, docs/checkpoints.md):
// state.json's format, the files' names, and the names parameters are saved under.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "accelerate/optimizer_state.h"

namespace tandem::accelerate {

inline constexpr int kStateFormat = 2;

/// model_<m>.safetensors, or one rank's model_<m>.rank<r>.safetensors.
std::string model_file(size_t model, int rank, bool sharded);
/// optimizer_<o>[.rank<r>].safetensors, or .pt for a LibTorch archive (a type without a named format).
std::string optimizer_file(size_t optimizer, int rank, bool sharded, bool named);
/// Each parameter's name: its name in the prepared model ("model_<m>/" before it from the second
/// model on); one that belongs to no prepared model is named by position ("param_groups.<g>.<i>").
ParamNames names_for(const std::vector<std::vector<std::pair<std::string, at::Tensor>>>& models,
                     const std::vector<std::vector<at::Tensor>>& groups);

}  // namespace tandem::accelerate
