#pragma once
// FSDP's mixed precision, PyTorch FSDP2's MixedPrecisionPolicy: the shards stay in the parameters'
// own dtype (float32) and the optimizer steps them there; the gathered parameters, and so the
// forward and backward, are in param_dtype; the gradients are reduce-scattered in reduce_dtype
// and added into the shards' float32 gradients (docs/guide-fsdp.md, "Mixed precision").
#include <optional>

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

namespace tandem::fsdp {

struct MixedPrecisionPolicy {
  /// The dtype of the gathered parameters: the all-gather's, the forward's and the backward's.
  /// nullopt: the parameters' own.
  TORCH_ARG(std::optional<at::ScalarType>, param_dtype) = std::nullopt;
  /// The dtype the gradients are reduce-scattered in. nullopt: param_dtype's. Under no_sync the
  /// whole gradients accumulate in it too.
  TORCH_ARG(std::optional<at::ScalarType>, reduce_dtype) = std::nullopt;
  /// Floating-point tensor outputs of the model and of each unit are cast to it. nullopt: left as
  /// computed.
  TORCH_ARG(std::optional<at::ScalarType>, output_dtype) = std::nullopt;
  /// Floating-point tensor arguments of the model's and each unit's forward are cast to param_dtype.
  TORCH_ARG(bool, cast_forward_inputs) = true;
};

}  // namespace tandem::fsdp
