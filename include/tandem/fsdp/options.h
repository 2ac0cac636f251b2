#pragma once
// Options of tandem::fsdp::FullyShardedDataParallel (PyTorch FSDP2's fully_shard arguments where
// they exist).
#include <cstdint>
#include <memory>
#include <optional>

#include <torch/arg.h>

#include "tandem/comm/process_group.h"
#include "tandem/fsdp/auto_wrap_policy.h"
#include "tandem/fsdp/mixed_precision.h"
#include "tandem/nn/checkpoint_policy.h"

namespace tandem::fsdp {

struct FullyShardOptions {
  /// Free a unit's gathered parameters after its forward and gather them again for its backward
  /// (FSDP2's default). Off: a unit stays gathered from its forward to the end of backward, which
  /// is ZeRO-2's memory for one all-gather less per unit and step. The root unit always stays.
  TORCH_ARG(bool, reshard_after_forward) = true;
  /// Gather the next unit (in the order the last step ran them) while this one computes, in
  /// forward and in backward. Off: each unit gathers when it runs, nothing overlaps.
  TORCH_ARG(bool, prefetch) = true;
  /// Start from rank 0's parameters and buffers (a broadcast at wrap time), as DDP does and
  /// FSDP1's sync_module_states=True. Off: every rank must have built the same weights.
  TORCH_ARG(bool, sync_module_states) = true;
  /// Make units with this policy first (auto_wrap.h): the Sequential entries it picks that are
  /// not units yet. The Accelerator uses AutoWrapPolicy() when none is given and the model has
  /// no tandem::fsdp::Unit of its own.
  TORCH_ARG(std::optional<AutoWrapPolicy>, auto_wrap) = std::nullopt;
  /// Gather and compute in a lower precision, reduce in a chosen one, keep and step float32
  /// shards (FSDP2's mp_policy; mixed_precision.h). The default changes nothing.
  TORCH_ARG(MixedPrecisionPolicy, mixed_precision) = {};
  /// Hybrid sharding (HSDP, FSDP2's 2-D mesh): shard over the wrapper's group, and replicate the
  /// shards over this one. A unit's gradients are reduce-scattered within the shard group, then
  /// all-reduced across the replicas; the average is over both (shard size x replicas). The
  /// groups must tile the job as a mesh's two dimensions do (DeviceMesh: {"replicate", "shard"}).
  /// Unset or of size 1: plain FSDP.
  TORCH_ARG(std::shared_ptr<comm::ProcessGroup>, replicate_group) = nullptr;
  /// Activation checkpointing of the units this policy picks (after auto_wrap): each recomputes its
  /// forward in its backward, once it is gathered again (tandem::nn::checkpoint_modules; a unit's
  /// own flag: Unit::set_activation_checkpointing). Unset: none.
  TORCH_ARG(std::optional<nn::CheckpointPolicy>, activation_checkpointing) = std::nullopt;
};

}  // namespace tandem::fsdp
