#include "tandem/comm/device_mesh.h"

#include <algorithm>
#include <set>

#include "tandem/comm/agreement.h"
#include "tandem/error.h"

namespace tandem::comm {
namespace {

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
  return text;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Row-major coordinates of `rank` in `shape`.
std::vector<int64_t> unravel(int64_t rank, const std::vector<int64_t>& shape) {
  std::vector<int64_t> coordinate(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coordinate[d] = rank % shape[d];
    rank /= shape[d];
  }
  return coordinate;
}

// The row-major index of `coordinate` over the dimensions not in `skip`: the same for exactly the
// ranks that differ only along `skip`, so it is the color that splits out those groups.
int64_t index_without(const std::vector<int64_t>& coordinate, const std::vector<int64_t>& shape,
                      const std::vector<size_t>& skip) {
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (std::find(skip.begin(), skip.end(), d) == skip.end()) index = index * shape[d] + coordinate[d];
  }
  return index;
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> pg, std::vector<int64_t> shape, std::vector<std::string> names) {
  TANDEM_CHECK(pg, "DeviceMesh: no process group");
  // Every rank must build the same mesh (Note [Agreement before waiting] in docs/design/comm.md):
  // a rank with another shape would split its groups differently and wait in them forever. First,
  // so that the checks below fail on every rank or none.
  Agreement("DeviceMesh").field("shape", shape_text(shape)).field("dimension names", join(names)).check(*pg);
  TANDEM_CHECK(!shape.empty(), "DeviceMesh: the shape is empty; give one size per dimension, e.g. {2, 2}");
  TANDEM_CHECK(names.size() == shape.size(), "DeviceMesh: shape ", shape_text(shape), " has ", shape.size(),
               " dimension(s) but ", names.size(), " name(s) were given (", join(names), ")");
  int64_t product = 1;
  std::set<std::string> seen;
  for (size_t d = 0; d < shape.size(); ++d) {
    TANDEM_CHECK(shape[d] >= 1, "DeviceMesh: dimension '", names[d], "' has size ", shape[d],
                 "; every size must be at least 1");
    TANDEM_CHECK(!names[d].empty(), "DeviceMesh: dimension ", d, " has an empty name");
    TANDEM_CHECK(seen.insert(names[d]).second, "DeviceMesh: the name '", names[d], "' is given twice (",
                 join(names), ")");
    TANDEM_CHECK(product <= (int64_t{1} << 31) / shape[d], "DeviceMesh: shape ", shape_text(shape), " is too large");
    product *= shape[d];
  }
  TANDEM_CHECK(product == pg->size(), "DeviceMesh: shape ", shape_text(shape), " holds ", product,
               " processes, but the process group has ", pg->size(), ": the sizes must multiply to the world size");
  auto root = std::make_shared<Root>();
  root->pg = pg;
  root->coordinate = unravel(pg->rank(), shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    Dim dim{names[d], shape[d], nullptr, {d}};
    const int color = static_cast<int>(index_without(root->coordinate, shape, {d}));
    dim.group = pg->split(color, names[d]);  // collective: every rank, every dimension, in order
    root->dims.push_back(dim);
  }
  root_ = root;
  dims_ = root->dims;
}

std::vector<int64_t> DeviceMesh::shape() const {
  std::vector<int64_t> sizes;
  for (const auto& d : dims_) sizes.push_back(d.size);
  return sizes;
}

std::vector<std::string> DeviceMesh::names() const {
  std::vector<std::string> out;
  for (const auto& d : dims_) out.push_back(d.name);
  return out;
}

int64_t DeviceMesh::size() const {
  int64_t n = 1;
  for (const auto& d : dims_) n *= d.size;
  return n;
}

std::string DeviceMesh::dims_text() const {
  std::vector<std::string> all;
  if (dims_.size() == root_->dims.size()) {  // the whole mesh, and what was flattened from it
    for (const auto& d : root_->dims) all.push_back(d.name);
    for (const auto& d : root_->flattened) all.push_back(d.name);
  } else {
    for (const auto& d : dims_) all.push_back(d.name);
  }
  return join(all);
}

const DeviceMesh::Dim& DeviceMesh::find(const std::string& dim) const {
  for (const auto& d : dims_) {
    if (d.name == dim) return d;
  }
  // The whole mesh also answers for the dimensions flattened from it; a sub-mesh only for its own
  // (PyTorch's mesh["dp"]["tp"] is an error too).
  const bool whole = dims_.size() == root_->dims.size();
  if (whole) {
    for (const auto& d : root_->flattened) {
      if (d.name == dim) return d;
    }
  }
  throw Error("DeviceMesh" + std::string(whole ? "" : " (a sub-mesh)") + " has no dimension '" + dim +
              "' (its dimensions: " + dims_text() + ")");
}

int64_t DeviceMesh::size(const std::string& dim) const { return find(dim).size; }

int DeviceMesh::local_rank(const std::string& dim) const { return find(dim).group->rank(); }

std::vector<int64_t> DeviceMesh::coordinate() const {
  std::vector<int64_t> out;
  for (const auto& d : dims_) out.push_back(d.group->rank());
  return out;
}

std::shared_ptr<ProcessGroup> DeviceMesh::group(const std::string& dim) const { return find(dim).group; }

std::shared_ptr<ProcessGroup> DeviceMesh::group() const {
  TANDEM_CHECK(dims_.size() == 1, "DeviceMesh::group(): the mesh has ", dims_.size(),
               " dimensions; name one (", join(names()), ")");
  return dims_.front().group;
}

DeviceMesh DeviceMesh::operator[](const std::string& dim) const { return (*this)[std::vector<std::string>{dim}]; }

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& dims) const {
  TANDEM_CHECK(!dims.empty(), "DeviceMesh: a sub-mesh needs at least one dimension");
  std::vector<Dim> picked;
  std::vector<size_t> covered;
  for (const auto& name : dims) {
    const Dim& d = find(name);
    for (size_t c : d.covers) {
      TANDEM_CHECK(std::find(covered.begin(), covered.end(), c) == covered.end(), "DeviceMesh: the sub-mesh (",
                   join(dims), ") names dimension '", root_->dims[c].name, "' more than once");
      TANDEM_CHECK(covered.empty() || c > covered.back(), "DeviceMesh: the sub-mesh (", join(dims),
                   ") must list its dimensions in the mesh's order (", dims_text(), ")");
      covered.push_back(c);
    }
    picked.push_back(d);
  }
  return DeviceMesh(root_, picked);
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& dims, const std::string& name) {
  TANDEM_CHECK(!name.empty(), "DeviceMesh::flatten: the new dimension needs a name");
  for (const auto& d : root_->dims) {
    TANDEM_CHECK(d.name != name, "DeviceMesh::flatten: '", name, "' already names a dimension (", dims_text(), ")");
  }
  for (const auto& d : root_->flattened) {
    TANDEM_CHECK(d.name != name, "DeviceMesh::flatten: '", name, "' already names a dimension (", dims_text(), ")");
  }
  const DeviceMesh view = (*this)[dims];  // checks the names and their order
  Dim flat{name, view.size(), nullptr, {}};
  for (const auto& d : view.dims_) flat.covers.insert(flat.covers.end(), d.covers.begin(), d.covers.end());
  const int color = static_cast<int>(index_without(root_->coordinate, root_->shape(), flat.covers));
  flat.group = root_->pg->split(color, name);  // collective over the whole mesh
  root_->flattened.push_back(flat);
  return DeviceMesh(root_, {flat});
}

std::vector<int> DeviceMesh::ranks() const {
  std::vector<size_t> covered;
  for (const auto& d : dims_) covered.insert(covered.end(), d.covers.begin(), d.covers.end());
  const std::vector<int64_t> root_shape = root_->shape();
  const int64_t mine = index_without(root_->coordinate, root_shape, covered);
  std::vector<int> out;
  for (int r = 0; r < root_->pg->size(); ++r) {
    if (index_without(unravel(r, root_shape), root_shape, covered) == mine) out.push_back(root_->pg->global_rank(r));
  }
  return out;
}

std::string DeviceMesh::describe() const {
  std::string text = "DeviceMesh(";
  for (size_t i = 0; i < dims_.size(); ++i) text += (i ? ", " : "") + dims_[i].name + "=" + std::to_string(dims_[i].size);
  text += ") at coordinate (";
  const auto c = coordinate();
  for (size_t i = 0; i < c.size(); ++i) text += (i ? ", " : "") + std::to_string(c[i]);
  return text + ")";
}

}  // namespace tandem::comm
