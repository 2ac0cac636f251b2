#pragma once
// Which modules to checkpoint: every N-th block of a model, as torchtitan's selective
// activation checkpointing ("every N layers"). checkpoint_modules applies a policy in place;
// AcceleratorOptions::activation_checkpointing and FullyShardOptions::activation_checkpointing
// take one.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/module.h>

namespace tandem::nn {

/// Example:
///   tandem::nn::checkpoint_modules(*model, tandem::nn::CheckpointPolicy().every_n(2));
///   tandem::nn::checkpoint_modules(*model, tandem::nn::CheckpointPolicy().module_names({"blocks.*"}));
struct CheckpointPolicy {
  /// Checkpoint every n-th block, counting the candidates from 1 in the model's order: 1, every
  /// block; 2, the 2nd, 4th, ... (torchtitan's selective "every N layers": count % n == 0).
  TORCH_ARG(int64_t, every_n) = 1;
  /// The candidates are the entries of the model's torch::nn::Sequential containers that have
  /// parameters, of these types when the list is not empty (Module::name(); for a
  /// tandem::fsdp::Unit or tandem::nn::Hookable, its wrapped module's).
  TORCH_ARG(std::vector<std::string>, module_types) = {};
  /// Names of modules in the model, as named_modules() gives them, with `*` for any run of
  /// characters ("layers.*", "*.attention"): when not empty, the candidates are the modules these
  /// name (and of module_types, when that is set too), wherever they are held: an entry of a
  /// Sequential is wrapped, a tandem::fsdp::Unit or tandem::nn::Hookable (in a ModuleList, or a
  /// named member) checkpoints itself. A named module held otherwise is a one-line error: LibTorch
  /// calls a plain member's forward with no way to run code around it.
  TORCH_ARG(std::vector<std::string>, module_names) = {};
  /// CheckpointOptions::preserve_rng_state of every segment.
  TORCH_ARG(bool, preserve_rng_state) = true;
};

/// Checkpoints the blocks `policy` picks under `root`, in place: an entry of a Sequential becomes
/// a tandem::nn::Checkpoint of itself, or, when it checkpoints itself (nn::Checkpointable, i.e. a
/// tandem::fsdp::Unit), has its flag set. Sequentials are searched top down; a candidate is not
/// looked into; an entry that contains a Checkpointable is no candidate (its units would run inside
/// the recompute) and is looked into instead. Entries already checkpointed count as candidates and
/// stay as they are. Returns how many blocks are checkpointed. Throws tandem::Error when every_n < 1
/// or when the model has no candidate at all.
size_t checkpoint_modules(torch::nn::Module& root, const CheckpointPolicy& policy = {});

}  // namespace tandem::nn
