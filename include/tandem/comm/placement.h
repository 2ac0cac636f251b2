#pragma once
// Placements: how one tensor lies on a DeviceMesh, one placement per mesh dimension, as PyTorch's
// DTensor says it (Shard(d), Replicate(), Partial()).
//
//   Shard(d)     the tensor is cut along its dimension d among that mesh dimension's processes,
//                ceil(size / n) each, the last ones shorter or empty (torch.chunk's rule, and
//                RowShardLayout's in comm/shard_layout.h);
//   Replicate()  every process along that mesh dimension holds the same values;
//   Partial()    every process holds a full-shaped tensor of partial values whose sum is the tensor.
//   _StridedShard(d, sf)
//                a Shard(d) applied after the later mesh dimensions' Shard(d)s instead of before
//                them (DTensor's name for FSDP over tensor parallelism: FSDP cuts the rows of the
//                piece tensor parallelism cut first, on a mesh ("shard", "tp")); sf is the size of
//                those later dimensions.
//
// A process's piece is always a box, [offsets[d], offsets[d] + sizes[d]) along each dimension d:
// local_chunk computes it from the mesh's shape, the process's coordinate and the placements
// (DTensor's compute_local_shape_and_global_offset, mesh dimensions applied left to right, so two
// Shards of one tensor dimension nest). Checkpoints store each piece with its box (Note [Sharded
// files] in src/accelerate/sharded_tensors.h), so a save on any mesh loads on any other.
//
// Example: a [7, 5] weight on a 2 x 2 mesh as (Shard(0), Shard(1)):
//   tandem::comm::DeviceMesh mesh(pg, {2, 2}, {"dp", "tp"});
//   auto chunk = tandem::comm::local_chunk({7, 5}, mesh, {Placement::shard(0), Placement::shard(1)});
//   // at coordinate (1, 0): offsets {4, 0}, sizes {3, 3}; at (1, 1): offsets {4, 3}, sizes {3, 2}
//   at::Tensor mine = tandem::comm::narrow_to(whole, chunk);
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem::comm {

class DeviceMesh;

struct Placement {
  enum class Kind { Shard, Replicate, Partial };
  Kind kind = Kind::Replicate;
  int64_t dim = 0;  // the tensor dimension, for Shard (negative counts from the end, as in PyTorch)
  int64_t split_factor = 0;  // > 0: a _StridedShard (Shard only), applied after the later Shard(dim)s

  static Placement shard(int64_t dim) { return {Kind::Shard, dim, 0}; }
  static Placement strided_shard(int64_t dim, int64_t split_factor) { return {Kind::Shard, dim, split_factor}; }
  static Placement replicate() { return {Kind::Replicate, 0, 0}; }
  static Placement partial() { return {Kind::Partial, 0, 0}; }

  bool is_shard() const { return kind == Kind::Shard; }
  bool is_strided() const { return kind == Kind::Shard && split_factor > 0; }
  bool operator==(const Placement& other) const {
    return kind == other.kind && (kind != Kind::Shard || (dim == other.dim && split_factor == other.split_factor));
  }
  /// "Shard(1)", "Replicate()", "Partial(sum)", "_StridedShard(dim=0, sf=2)".
  std::string str() const;
};

/// The placements as PyTorch prints them: "(Shard(0), Replicate())".
std::string to_string(const std::vector<Placement>& placements);

/// A box of a tensor: elements [offsets[d], offsets[d] + sizes[d]) along every dimension d.
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t numel() const;
  bool operator==(const Chunk& other) const { return offsets == other.offsets && sizes == other.sizes; }
};

/// The box held at `coordinate` of a mesh of `mesh_shape` by a tensor of `shape` placed as
/// `placements` (one per mesh dimension). An empty piece's offset along its dimension is that
/// dimension's size, as DTensor's. One-line tandem::Error for placements of the wrong count, a
/// Shard of a dimension the tensor lacks (a 0-d tensor has none), or a coordinate off the mesh.
Chunk local_chunk(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh_shape,
                  const std::vector<int64_t>& coordinate, const std::vector<Placement>& placements);
/// This process's box on `mesh`.
Chunk local_chunk(const std::vector<int64_t>& shape, const DeviceMesh& mesh, const std::vector<Placement>& placements);

/// Whether the process at `coordinate` writes its piece into a checkpoint: the pieces of one
/// tensor must tile it once, so of the copies along Replicate dimensions only coordinate 0's is
/// written. A Partial tensor holds no piece of the tensor at all: one-line tandem::Error naming
/// `what` (reduce it to Replicate first).
bool writes_chunk(const std::vector<int64_t>& coordinate, const std::vector<Placement>& placements,
                  const std::string& what);

/// The box `chunk` of `whole` (a view).
at::Tensor narrow_to(const at::Tensor& whole, const Chunk& chunk);

}  // namespace tandem::comm
