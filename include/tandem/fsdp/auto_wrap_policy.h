#pragma once
// Which modules auto_wrap makes units (auto_wrap.h).
#include <cstdint>
#include <string>
#include <vector>

#include <torch/arg.h>

namespace tandem::fsdp {

struct AutoWrapPolicy {
  /// An entry becomes a unit when it has at least this many parameter elements...
  TORCH_ARG(int64_t, min_params) = 1;
  /// ...and, when this list is not empty, its type is one of these (Module::name(), e.g.
  /// "torch::nn::LinearImpl", or the name a custom module gives its base).
  TORCH_ARG(std::vector<std::string>, module_types) = {};
};

}  // namespace tandem::fsdp
