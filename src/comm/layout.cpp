#include "tandem/comm/layout.h"

#include "tandem/error.h"

namespace tandem::comm {

bool Layout::whole() const {
  for (const auto& p : placements) {
    if (p.is_shard()) return false;
  }
  return true;
}

bool Layout::counts() const {
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  if (numel == 0) {  // nothing to hold: one process names it
    for (auto c : coordinate) {
      if (c != 0) return false;
    }
    return true;
  }
  return chunk.numel() > 0 && writes_chunk(coordinate, placements, "a tensor of layout " + str());
}

std::string Layout::str() const {
  std::string mesh;
  for (size_t m = 0; m < mesh_dims.size(); ++m) {
    mesh += (m ? " x " : "") + mesh_dims[m] + " " + std::to_string(mesh_shape[m]);
  }
  std::string box, whole;
  for (size_t d = 0; d < chunk.sizes.size(); ++d) {
    box += (d ? ", " : "") + std::to_string(chunk.offsets[d]) + ":" + std::to_string(chunk.offsets[d] + chunk.sizes[d]);
  }
  for (size_t d = 0; d < shape.size(); ++d) whole += (d ? ", " : "") + std::to_string(shape[d]);
  return to_string(placements) + " on " + (mesh.empty() ? "one process" : mesh) + ": [" + box + "] of [" + whole + "]";
}

Layout make_layout(std::vector<std::string> dims, std::vector<int64_t> mesh_shape, std::vector<int64_t> coordinate,
                   std::vector<Placement> placements, std::vector<int64_t> shape) {
  TANDEM_CHECK(dims.size() == mesh_shape.size(), "layout: ", dims.size(), " dimension name(s) for a mesh of ",
               mesh_shape.size(), " dimension(s)");
  Layout layout{std::move(dims), std::move(mesh_shape), std::move(coordinate), std::move(placements), std::move(shape), {}};
  // A 0-d tensor is one row (FSDP shards it so: comm::RowShardLayout).
  const std::vector<int64_t> rows = layout.shape.empty() ? std::vector<int64_t>{1} : layout.shape;
  layout.chunk = local_chunk(rows, layout.mesh_shape, layout.coordinate, layout.placements);
  return layout;
}

}  // namespace tandem::comm
