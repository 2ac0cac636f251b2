#pragma once
// DeviceMesh: the processes of a job laid out as an N-dimensional array with named dimensions,
// each dimension a process group (PyTorch's init_device_mesh / DeviceMesh).
//
// Ranks are laid out row-major: in a 2 x 4 mesh ("dp", "tp") rank r sits at (r / 4, r % 4), and
// mesh["tp"] of rank 5 is the group of ranks {4, 5, 6, 7}, mesh["dp"] the group {1, 5}. The last
// dimension varies fastest, so it should be the one that talks most (tensor parallelism): its
// ranks are neighbours, on one host when the hosts hold consecutive ranks.
//
// Construction is collective over the process group (it makes one subgroup per dimension), and so
// is flatten(). Indexing is local.
//
// Example:
//   auto pg = tandem::comm::ProcessGroup::create(tandem::comm::World::from_env());
//   tandem::comm::DeviceMesh mesh(pg, {2, 2}, {"dp", "tp"});
//   auto tp = mesh["tp"].group();          // this rank's tensor-parallel group
//   int dp_index = mesh.local_rank("dp");  // its coordinate along "dp"
//   auto dp_tp = mesh.flatten({"dp", "tp"}, "dp_tp");
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/process_group.h"

namespace tandem::comm {

class DeviceMesh {
 public:
  /// Lays `pg`'s ranks out as `shape` (row-major) with one name per dimension, and creates each
  /// dimension's subgroup. Collective over `pg`. One-line errors: an empty shape, a size below 1,
  /// a product other than pg->size(), names missing, empty, repeated.
  DeviceMesh(std::shared_ptr<ProcessGroup> pg, std::vector<int64_t> shape, std::vector<std::string> names);

  int64_t ndim() const { return static_cast<int64_t>(dims_.size()); }
  /// The sizes and names of this mesh's dimensions, in order.
  std::vector<int64_t> shape() const;
  std::vector<std::string> names() const;
  /// How many processes the mesh holds (the product of the shape).
  int64_t size() const;
  /// The size of one dimension, by name.
  int64_t size(const std::string& dim) const;
  /// This process's coordinate along `dim` (its rank in that dimension's group).
  int local_rank(const std::string& dim) const;
  /// This process's coordinates, one per dimension.
  std::vector<int64_t> coordinate() const;
  /// The global ranks of this mesh's processes, row-major.
  std::vector<int> ranks() const;

  /// The subgroup of `dim`: the processes that differ from this one only along it.
  std::shared_ptr<ProcessGroup> group(const std::string& dim) const;
  /// A 1-D mesh's only group; an error on a mesh of several dimensions.
  std::shared_ptr<ProcessGroup> group() const;

  /// The sub-mesh of one dimension (mesh["tp"]), or of several (in this mesh's order), as seen
  /// from this process: the processes that share its coordinates along every other dimension.
  DeviceMesh operator[](const std::string& dim) const;
  DeviceMesh operator[](const std::vector<std::string>& dims) const;

  /// Collective over the whole mesh: one dimension spanning `dims` (adjacent or not, in this
  /// mesh's order), named `name`, whose group is every process sharing the other coordinates;
  /// row-major over `dims`. Registered, so mesh[name] finds it later (PyTorch's _flatten).
  DeviceMesh flatten(const std::vector<std::string>& dims, const std::string& name);

  /// "DeviceMesh(dp=2, tp=2) at coordinate (1, 0)".
  std::string describe() const;

 private:
  struct Dim {
    std::string name;
    int64_t size = 1;
    std::shared_ptr<ProcessGroup> group;
    std::vector<size_t> covers;  // the root's dimensions it spans (one, or several when flattened)
  };
  // What every view of one mesh shares: the root's dimensions and those flattened from them.
  struct Root {
    std::shared_ptr<ProcessGroup> pg;
    std::vector<Dim> dims;
    std::vector<int64_t> coordinate;  // this process's, along dims
    std::vector<Dim> flattened;
    std::vector<int64_t> shape() const {
      std::vector<int64_t> sizes;
      for (const auto& d : dims) sizes.push_back(d.size);
      return sizes;
    }
  };
  DeviceMesh(std::shared_ptr<Root> root, std::vector<Dim> dims) : root_(std::move(root)), dims_(std::move(dims)) {}
  const Dim& find(const std::string& dim) const;
  std::string dims_text() const;

  std::shared_ptr<Root> root_;
  std::vector<Dim> dims_;
};

}  // namespace tandem::comm
