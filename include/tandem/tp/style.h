#pragma once
// The parallel styles of a tensor-parallel plan (PyTorch's torch.distributed.tensor.parallel):
// how one module's parameters are cut over the tensor-parallel group, and how its inputs and
// output move between layouts around its forward. Layouts are placements along that group
// (tandem/comm/placement.h): Replicate() (every rank the same), Shard(d) (cut along dimension d).
//
// Between modules, gradients travel as their activations' layouts say, whole: a Replicate
// activation's gradient is the same on every rank, a Shard's is this rank's part of the whole
// gradient (the backwards of tandem/tp/functional.h keep it so).
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <torch/arg.h>

#include "tandem/comm/placement.h"

namespace tandem::tp {

using comm::Placement;

/// Linear: weight and bias Shard(0) (each rank computes some output features); Embedding: weight
/// Shard(1) (some of each token's features). Input: Replicate (its gradient all-reduced; layers
/// reading one tensor share that all-reduce) or Shard(d) (all-gathered along d, the gradient
/// reduce-scattered: sequence parallelism's input). Output: Shard(-1) (the local features, the
/// default) or Replicate (all-gathered).
struct ColwiseParallel {
  TORCH_ARG(Placement, input_layout) = Placement::replicate();
  TORCH_ARG(Placement, output_layout) = Placement::shard(-1);
};

/// Linear: weight Shard(1), bias Replicate (added once, after the reduction); Embedding: weight
/// Shard(0) (some rows of the vocabulary; other tokens look up zeros). Input: Linear's Shard(-1)
/// (a ColwiseParallel's output), Embedding's Replicate, unless set; a Replicate input of a Linear
/// is cut to this rank's chunk, a Shard(d) input of an Embedding all-gathered. Output: Replicate
/// (all-reduced, the default) or Shard(d) of a dimension other than the last (reduce-scattered
/// along d: sequence parallelism's output).
struct RowwiseParallel {
  TORCH_ARG(std::optional<Placement>, input_layout) = std::nullopt;
  TORCH_ARG(Placement, output_layout) = Placement::replicate();
};

/// A module that runs on its input's sequence shard as it is (LayerNorm, RMSNorm, dropout): input
/// and output Shard(sequence_dim), untouched; its parameters stay whole on every rank, and their
/// gradients, each rank's part of the sum over the sequence, are all-reduced over the group.
struct SequenceParallel {
  TORCH_ARG(int64_t, sequence_dim) = 1;
};

/// Moves the module's tensor arguments, one layout per argument in order, from `input_layouts` to
/// `desired_input_layouts`: Shard(d) -> Replicate all-gathers, Replicate -> Shard(d) takes this
/// rank's chunk, Partial -> Replicate all-reduces (Partial -> Shard(d) reduce-scatters), equal
/// layouts leave the argument alone. A desired layout is never Partial.
struct PrepareModuleInput {
  TORCH_ARG(std::vector<Placement>, input_layouts);
  TORCH_ARG(std::vector<Placement>, desired_input_layouts);
};

/// Moves the module's output from `output_layout` to `desired_output_layout`, as PrepareModuleInput.
struct PrepareModuleOutput {
  TORCH_ARG(Placement, output_layout) = Placement::replicate();
  TORCH_ARG(Placement, desired_output_layout) = Placement::replicate();
};

using Style = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput, PrepareModuleOutput>;

/// "ColwiseParallel", "RowwiseParallel", ...
std::string style_name(const Style& style);

/// Module names (dot-separated, as named_modules gives them; each part may be a glob: "blocks.*.q")
/// and the style of the modules they match, as parallelize_module's plan.
using Plan = std::vector<std::pair<std::string, Style>>;

}  // namespace tandem::tp
