#pragma once
// Layout: where one tensor lies across the processes, DTensor's (mesh, placements) with the box
// this process holds, as the Accelerator publishes it for every tensor of a prepared model
// (Accelerator::layouts). Checkpoints, clipping and get_state_dict read it: which box a process
// holds, and whether its copy is the one that counts (the ownership rule: the first copy along
// every Replicate dimension, comm::writes_chunk).
//
// Example: FSDP over 2 processes, each parameter's rows halved:
//   for (const auto& [name, layout] : acc.layouts(model)) std::printf("%s %s\n", name.c_str(), layout.str().c_str());
//   // weight (Replicate(), Shard(0), Replicate()) on replicate 1 x shard 2 x tp 1: [0:4, 0:5] of [7, 5]
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/comm/placement.h"

namespace tandem::comm {

struct Layout {
  std::vector<std::string> mesh_dims;  // the mesh's dimension names
  std::vector<int64_t> mesh_shape;
  std::vector<int64_t> coordinate;     // this process on the mesh
  std::vector<Placement> placements;   // one per mesh dimension
  std::vector<int64_t> shape;          // the whole tensor's
  Chunk chunk;                         // this process's box (a 0-d tensor's: one row, [0:1] or [1:1])

  /// Whether no placement cuts the tensor (a Shard along a dimension of size 1 still counts as a
  /// cut: the tensor is stored as pieces, of which this process holds the one).
  bool whole() const;
  /// Whether this process's box is the copy that counts (a checkpoint writes it, a norm sums it):
  /// the first one along every Replicate dimension, and not empty. An empty tensor's one
  /// (empty) box is the first process's.
  bool counts() const;
  /// "(Replicate(), Shard(0)) on replicate 2 x shard 2: [0:4, 0:5] of [7, 5]".
  std::string str() const;
};

/// The layout of a tensor of `shape` placed as `placements` on a mesh (`dims`, `mesh_shape`) at
/// `coordinate`; its box from comm::local_chunk (a 0-d tensor is cut as one row). One-line
/// tandem::Error for what local_chunk refuses, or dimension names not one per mesh dimension.
Layout make_layout(std::vector<std::string> dims, std::vector<int64_t> mesh_shape, std::vector<int64_t> coordinate,
                   std::vector<Placement> placements, std::vector<int64_t> shape);

}  // namespace tandem::comm
