#pragma once
// How things are split over `world` ranks: one rule, ceil(n / world) per rank, for elements and
// for rows.
//
// ShardLayout: a flat buffer of `total` elements for the flat collectives
// (ProcessGroup::reduce_scatter / all_gather_into): ceil(total / world) elements per rank, the
// buffer padded to world times that; rank r owns [begin(r), end(r)), which is shorter or empty for
// the last ranks when the sizes do not divide (FSDP2 pads alike). ZeRO-2's buckets are cut so.
//
//   tandem::comm::ShardLayout layout{grad.numel(), pg->size()};
//   at::Tensor padded = at::zeros({layout.padded()});  // grad copied into its front
//   at::Tensor mine = at::empty({layout.shard()});
//   pg->reduce_scatter(mine, padded);                  // mine[0, layout.owned(rank)) is real
//
// RowShardLayout: a tensor cut along dim 0 (FSDP2's rule, FSDP's parameters and the checkpoints
// of their rows): the same rule over its rows (a 0-d tensor is one row). Rank r owns rows
// [first_row(r), first_row(r) + owned_rows(r)); every rank's chunk is chunk_rows() rows, the last
// ranks' padded.
//
//   const auto cut = tandem::comm::RowShardLayout::of(param.sizes().vec(), pg->size());
//   at::Tensor mine = at::empty(cut.owned_shape(pg->rank()));  // [owned rows, shape[1:]...]
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace tandem::comm {

struct ShardLayout {
  int64_t total = 0;
  int64_t world = 1;

  /// Elements per rank, padding included.
  int64_t shard() const { return world > 0 ? (total + world - 1) / world : 0; }
  /// The padded buffer: world * shard().
  int64_t padded() const { return shard() * world; }
  /// Rank `rank`'s slice of the real elements: [begin, end).
  int64_t begin(int64_t rank) const { return std::min(total, rank * shard()); }
  int64_t end(int64_t rank) const { return std::min(total, (rank + 1) * shard()); }
  /// How many of rank `rank`'s shard() elements are real (the rest is padding).
  int64_t owned(int64_t rank) const { return end(rank) - begin(rank); }
};

/// The rows of a tensor of `shape` along dim 0 (a 0-d tensor is one row).
inline int64_t row_count(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }

/// The shape of `count` rows of a tensor of `shape`: [count, shape[1:]...] (a 0-d tensor's rows: [count]).
inline std::vector<int64_t> rows_shape(std::vector<int64_t> shape, int64_t count) {
  if (shape.empty()) return {count};
  shape[0] = count;
  return shape;
}

struct RowShardLayout {
  std::vector<int64_t> shape;  // the whole tensor's
  int64_t rows = 0;            // row_count(shape)
  int64_t row_numel = 0;       // elements of one row (0 for a tensor of no rows)
  int64_t world = 1;

  static RowShardLayout of(std::vector<int64_t> shape, int64_t world) {
    RowShardLayout cut{std::move(shape), 0, 0, world};
    cut.rows = row_count(cut.shape);
    int64_t numel = 1;
    for (auto d : cut.shape) numel *= d;
    cut.row_numel = cut.rows == 0 ? 0 : numel / cut.rows;
    return cut;
  }
  /// The rule over the rows.
  ShardLayout row_layout() const { return ShardLayout{rows, world}; }
  /// Rows per rank, padding included: ceil(rows / world).
  int64_t chunk_rows() const { return row_layout().shard(); }
  /// Elements per rank, padding included.
  int64_t chunk_numel() const { return chunk_rows() * row_numel; }
  int64_t first_row(int64_t rank) const { return row_layout().begin(rank); }
  int64_t owned_rows(int64_t rank) const { return row_layout().owned(rank); }
  /// The shape of rank `rank`'s rows.
  std::vector<int64_t> owned_shape(int64_t rank) const { return rows_shape(shape, owned_rows(rank)); }
};

}  // namespace tandem::comm
