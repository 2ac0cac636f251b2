#pragma once
// One file from a checkpoint's weights or optimizer state, whatever the world size and sharding it
// was saved with (Note [Sharded files] in src/accelerate/sharded_tensors.h, Note [Optimizer
// state by name] in src/accelerate/optimizer_state.h). `tandem checkpoint consolidate` calls them;
// Python reads the result with safetensors.torch.load_file.
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

/// Writes model `model`'s weights and buffers from the checkpoint folder `checkpoint` (verified
/// against its manifest) to the safetensors file `out`, every tensor whole under its name with
/// the metadata "format": "pt": a plain state dict (safetensors.torch.load_file, then
/// load_state_dict). The same weights give the same bytes, whole or sharded by any world size.
/// Throws tandem::Error (one line) for a checkpoint without that model, missing or overlapping
/// shards, or a failed write.
void consolidate_model(const std::string& checkpoint, size_t model, const std::string& out);

}  // namespace tandem::accelerate
