#pragma once
// One file from a checkpoint's optimizer state, whatever the world size and sharding it was saved
// with (Note [Optimizer state by name] in src/accelerate/optimizer_state.h). `tandem checkpoint
// consolidate` calls it; Python reads the result with safetensors.torch.load_file.
//
// Example:
//   tandem::accelerate::consolidate_optimizer("ckpt/checkpoint_000120", 0, "adam.safetensors");
//   // adam.safetensors: "fc.weight.exp_avg", "fc.weight.step", ... and in its metadata the
//   // optimizer's type and param groups (names, hyper-parameters) as JSON.
#include <cstddef>
#include <string>

namespace tandem::accelerate {

/// Writes optimizer `optimizer`'s state from the checkpoint folder `checkpoint` (verified against
/// its manifest) to the safetensors file `out`: every "<parameter>.<key>" tensor of every shard,
/// once, and the metadata "format" ("pt"), "optimizer" (its type) and "param_groups" (JSON). The
/// same state gives the same bytes, however it was sharded. Throws tandem::Error (one line) for a
/// checkpoint without that optimizer, one saved as a LibTorch archive (an optimizer type without
/// a named format), shards that overlap or name no parameter of the optimizer, or a failed write.
void consolidate_optimizer(const std::string& checkpoint, size_t optimizer, const std::string& out);

}  // namespace tandem::accelerate
