#pragma once
// How a flat buffer of `total` elements is split over `world` ranks for the flat collectives
// (ProcessGroup::reduce_scatter / all_gather_into): ceil(total / world) elements per rank, the
// buffer padded to world times that; rank r owns [begin(r), end(r)), which is shorter or empty for
// the last ranks when the sizes do not divide (FSDP2 pads alike).
//
//   tandem::comm::ShardLayout layout{grad.numel(), pg->size()};
//   at::Tensor padded = at::zeros({layout.padded()});  // grad copied into its front
//   at::Tensor mine = at::empty({layout.shard()});
//   pg->reduce_scatter(mine, padded);                  // mine[0, layout.owned(rank)) is real
#include <algorithm>
#include <cstdint>

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

}  // namespace tandem::comm
