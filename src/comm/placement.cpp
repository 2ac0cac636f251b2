#include "tandem/comm/placement.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/StringUtil.h>

#include "tandem/comm/device_mesh.h"
#include "tandem/comm/shard_layout.h"
#include "tandem/error.h"

namespace tandem::comm {

std::string Placement::str() const {
  switch (kind) {
    case Kind::Shard:
      if (split_factor > 0) return "_StridedShard(dim=" + std::to_string(dim) + ", sf=" + std::to_string(split_factor) + ")";
      return "Shard(" + std::to_string(dim) + ")";
    case Kind::Replicate:
      return "Replicate()";
    case Kind::Partial:
      return "Partial(sum)";
  }
  return "?";
}

std::string to_string(const std::vector<Placement>& placements) {
  std::string out = "(";
  for (size_t i = 0; i < placements.size(); ++i) out += (i ? ", " : "") + placements[i].str();
  return out + ")";
}

int64_t Chunk::numel() const {
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  return n;
}

Chunk local_chunk(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh_shape,
                  const std::vector<int64_t>& coordinate, const std::vector<Placement>& placements) {
  const auto ndim = static_cast<int64_t>(shape.size());
  TANDEM_CHECK(placements.size() == mesh_shape.size(), "placements ", to_string(placements), ": ", placements.size(),
               " placement(s) for a mesh of ", mesh_shape.size(), " dimension(s); give one per mesh dimension");
  TANDEM_CHECK(coordinate.size() == mesh_shape.size(), "placements: coordinate of ", coordinate.size(),
               " dimension(s) on a mesh of ", mesh_shape.size());
  Chunk chunk{std::vector<int64_t>(shape.size(), 0), shape};
  std::vector<bool> sharded(shape.size(), false);
  // The mesh dimensions in the order they cut: left to right, a _StridedShard after the others.
  std::vector<size_t> order;
  for (size_t m = 0; m < placements.size(); ++m) {
    if (!placements[m].is_strided()) order.push_back(m);
  }
  for (size_t m = placements.size(); m-- > 0;) {
    if (placements[m].is_strided()) order.push_back(m);
  }
  for (size_t m : order) {
    TANDEM_CHECK(coordinate[m] >= 0 && coordinate[m] < mesh_shape[m], "placements: coordinate ", coordinate[m],
                 " along mesh dimension ", m, " of size ", mesh_shape[m]);
    if (!placements[m].is_shard()) continue;
    const int64_t d = placements[m].dim < 0 ? placements[m].dim + ndim : placements[m].dim;
    TANDEM_CHECK(d >= 0 && d < ndim, "placements ", to_string(placements), ": ", placements[m].str(), " of a ", ndim,
                 "-dimensional tensor ", c10::str(c10::IntArrayRef(shape)), " (it has no dimension ",
                 placements[m].dim, ")");
    // The rule over what the earlier mesh dimensions left of dimension d: ceil(size / n) each.
    const ShardLayout cut{chunk.sizes[d], mesh_shape[m]};
    chunk.offsets[d] += cut.begin(coordinate[m]);
    chunk.sizes[d] = cut.owned(coordinate[m]);
    sharded[d] = true;
  }
  // DTensor's offset for an empty piece: the dimension's size (where nothing begins).
  for (size_t d = 0; d < shape.size(); ++d) {
    if (sharded[d] && chunk.sizes[d] == 0) chunk.offsets[d] = shape[d];
  }
  return chunk;
}

Chunk local_chunk(const std::vector<int64_t>& shape, const DeviceMesh& mesh, const std::vector<Placement>& placements) {
  return local_chunk(shape, mesh.shape(), mesh.coordinate(), placements);
}

bool writes_chunk(const std::vector<int64_t>& coordinate, const std::vector<Placement>& placements,
                  const std::string& what) {
  TANDEM_CHECK(coordinate.size() == placements.size(), what, ": ", placements.size(),
               " placement(s) for a coordinate of ", coordinate.size(), " dimension(s)");
  bool writes = true;
  for (size_t m = 0; m < placements.size(); ++m) {
    TANDEM_CHECK(placements[m].kind != Placement::Kind::Partial, what, " is ", to_string(placements),
                 ": a Partial() tensor holds partial sums, not a piece of the tensor; reduce it to Replicate() "
                 "before saving");
    if (!placements[m].is_shard()) writes = writes && coordinate[m] == 0;
  }
  return writes;
}

at::Tensor narrow_to(const at::Tensor& whole, const Chunk& chunk) {
  TANDEM_CHECK(static_cast<size_t>(whole.dim()) == chunk.sizes.size() && chunk.offsets.size() == chunk.sizes.size(),
               "narrow_to: a chunk of ", chunk.sizes.size(), " dimension(s) of a ", whole.dim(), "-dimensional tensor");
  at::Tensor out = whole;
  for (size_t d = 0; d < chunk.sizes.size(); ++d) {
    // An empty piece's offset may be the dimension's size (DTensor's), which narrow accepts.
    out = out.narrow(static_cast<int64_t>(d), chunk.offsets[d], chunk.sizes[d]);
  }
  return out;
}

}  // namespace tandem::comm
