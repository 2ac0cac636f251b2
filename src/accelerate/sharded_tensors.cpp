#include "accelerate/sharded_tensors.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

#include "tandem/error.h"

namespace tandem::accelerate {
namespace {

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

/// The dimensions pieces are boxes in: the tensor's own, a 0-d tensor's one row.
std::vector<int64_t> box_shape(const std::vector<int64_t>& shape) {
  return shape.empty() ? std::vector<int64_t>{1} : shape;
}

/// Elements of a box, or -1 when they do not fit in int64 (an empty dimension makes it 0, whatever
/// the others).
int64_t volume(const std::vector<int64_t>& sizes) {
  if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) return 0;
  int64_t n = 1;
  for (auto s : sizes) {
    if (__builtin_mul_overflow(n, s, &n)) return -1;
  }
  return n;
}

/// A number as JSON gives it (unsigned 64-bit), at most INT64_MAX: no input wraps.
bool fits(const nlohmann::json& x) {
  return x.is_number_unsigned() && x.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
}

/// A JSON array of such numbers, or false.
bool numbers(const nlohmann::json& v, std::vector<int64_t>& out) {
  if (!v.is_array()) return false;
  out.clear();
  for (const auto& x : v) {
    if (!fits(x)) return false;
    out.push_back(x.get<int64_t>());
  }
  return true;
}

/// A box for messages: "rows 4 to 7" when it spans every other dimension, else "elements [4:7, 0:3]".
std::string region_text(const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes,
                        const std::vector<int64_t>& box) {
  bool rows = true;
  for (size_t d = 1; d < box.size(); ++d) rows = rows && offsets[d] == 0 && sizes[d] == box[d];
  if (rows) return message("rows ", offsets[0], " to ", offsets[0] + sizes[0]);
  std::string out = "elements [";
  for (size_t d = 0; d < box.size(); ++d) out += message(d ? ", " : "", offsets[d], ":", offsets[d] + sizes[d]);
  return out + "]";
}

/// The metadata `key` of a file: a JSON object naming only tensors the file holds.
nlohmann::json metadata_object(const SafetensorsIndex& index, const char* key, const std::string& where,
                               const std::string& file, const std::map<std::string, size_t>& entry_of) {
  nlohmann::json value = nlohmann::json::object();
  auto it = index.metadata.find(key);
  if (it == index.metadata.end()) return value;
  try {
    value = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception&) {
    throw Error(message(where, ": ", file, ": its ", key, " metadata is not valid JSON"));
  }
  TANDEM_CHECK(value.is_object(), where, ": ", file, ": its ", key, " metadata is not a JSON object");
  for (const auto& [name, v] : value.items()) {
    TANDEM_CHECK(entry_of.count(name), where, ": ", file, ": ", key, " names '", name,
                 "', which the file does not hold");
  }
  return value;
}

}  // namespace

std::vector<std::string> model_files(const nlohmann::json& state, size_t model) {
  if (!state.contains("model_files")) return {"model_" + std::to_string(model) + ".safetensors"};
  return state.at("model_files").at(model).get<std::vector<std::string>>();
}

ChunkPiece ChunkPiece::rows(std::string name, at::Tensor tensor, int64_t first_row, std::vector<int64_t> whole_shape) {
  std::vector<int64_t> offsets(box_shape(whole_shape).size(), 0);
  offsets[0] = first_row;
  return {std::move(name), std::move(tensor), std::move(offsets), std::move(whole_shape)};
}

std::string chunk_pieces_bytes(const std::vector<ChunkPiece>& pieces) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json chunks = nlohmann::json::object();
  for (const auto& p : pieces) {
    tensors.emplace_back(p.name, p.tensor);
    const bool at_origin = std::all_of(p.offsets.begin(), p.offsets.end(), [](int64_t o) { return o == 0; });
    if (!at_origin || p.tensor.sizes() != c10::IntArrayRef(p.whole_shape)) {
      // A piece is a box in the whole's dimensions (a 0-d tensor's: one row); anything else is our bug.
      const size_t dims = box_shape(p.whole_shape).size();
      TANDEM_CHECK(p.offsets.size() == dims && static_cast<size_t>(p.tensor.dim()) == dims, "checkpoint: '", p.name,
                   "' is ", shape_text(p.tensor.sizes().vec()), " at ", shape_text(p.offsets), ", not a box of a ",
                   shape_text(p.whole_shape), " tensor");
      chunks[p.name] = {p.offsets, p.whole_shape};
    }
  }
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  if (!chunks.empty()) metadata[kChunksMetadataKey] = chunks.dump();
  return safetensors_bytes(tensors, metadata);
}

ShardedTensors::ShardedTensors(const std::vector<std::string>& paths, std::string where) : where_(std::move(where)) {
  for (size_t f = 0; f < paths.size(); ++f) {
    files_.push_back(index_safetensors(paths[f]));
    const SafetensorsIndex& index = files_.back();
    const std::string file = base_name(paths[f]);
    std::map<std::string, size_t> entry_of;
    for (size_t e = 0; e < index.tensors.size(); ++e) entry_of[index.tensors[e].name] = e;
    const auto rows = metadata_object(index, kRowsMetadataKey, where_, file, entry_of);
    const auto chunks = metadata_object(index, kChunksMetadataKey, where_, file, entry_of);
    for (size_t e = 0; e < index.tensors.size(); ++e) {
      const auto& entry = index.tensors[e];
      TANDEM_CHECK(!(rows.contains(entry.name) && chunks.contains(entry.name)), where_, ": ", file, ": '", entry.name,
                   "' is in both ", kRowsMetadataKey, " and ", kChunksMetadataKey);
      std::vector<int64_t> shape = entry.shape;  // the whole tensor's
      std::vector<int64_t> offsets(box_shape(shape).size(), 0);
      if (rows.contains(entry.name)) {
        const auto& v = rows[entry.name];
        TANDEM_CHECK(v.is_array() && v.size() == 2 && fits(v[0]) && numbers(v[1], shape), where_, ": ", file,
                     ": the rows of '", entry.name, "' are not [first row, [whole shape]]");
        const int64_t first = v[0].get<int64_t>();
        // The piece is [n, shape[1:]...] (a 0-d tensor's rows: [n]) and lies within the rows.
        const std::vector<int64_t> expected = comm::rows_shape(shape, entry.shape.empty() ? -1 : entry.shape[0]);
        TANDEM_CHECK(entry.shape == expected && first <= comm::row_count(shape) &&
                         entry.shape[0] <= comm::row_count(shape) - first,
                     where_, ": ", file, ": '", entry.name, "' is ", shape_text(entry.shape), " from row ", first,
                     ", which is not rows of a ", shape_text(shape), " tensor");
        offsets.assign(box_shape(shape).size(), 0);
        offsets[0] = first;
      } else if (chunks.contains(entry.name)) {
        const auto& v = chunks[entry.name];
        TANDEM_CHECK(v.is_array() && v.size() == 2 && numbers(v[0], offsets) && numbers(v[1], shape), where_, ": ",
                     file, ": the chunk of '", entry.name, "' is not [[offsets], [whole shape]]");
        const auto box = box_shape(shape);
        bool inside = offsets.size() == box.size() && entry.shape.size() == box.size();
        for (size_t d = 0; inside && d < box.size(); ++d) {
          inside = offsets[d] <= box[d] && entry.shape[d] <= box[d] - offsets[d];
        }
        TANDEM_CHECK(inside, where_, ": ", file, ": '", entry.name, "' is ", shape_text(entry.shape), " at ",
                     shape_text(offsets), ", which is not a box of a ", shape_text(shape), " tensor");
      }
      const bool piece = rows.contains(entry.name) || chunks.contains(entry.name);
      const std::vector<int64_t> sizes = piece ? entry.shape : box_shape(shape);
      TANDEM_CHECK(volume(shape) >= 0, where_, ": ", file, ": '", entry.name, "' is ", shape_text(shape),
                   ", more elements than 64 bits count");
      auto [it, fresh] = tensors_.try_emplace(entry.name, Tensor{shape, entry.dtype, f, {}});
      TANDEM_CHECK(it->second.shape == shape && it->second.dtype == entry.dtype, where_, ": '", entry.name, "' is ",
                   c10::toString(entry.dtype), shape_text(shape), " in ", file, " but ", c10::toString(it->second.dtype),
                   shape_text(it->second.shape), " in ", file_name(it->second.first_file),
                   ": files of two checkpoints mixed?");
      (void)fresh;
      if (volume(sizes) > 0) it->second.pieces.push_back({f, e, offsets, sizes});
    }
  }
  for (auto& [name, tensor] : tensors_) {
    std::sort(tensor.pieces.begin(), tensor.pieces.end(), [](const Piece& a, const Piece& b) {
      return std::tie(a.offsets, a.file) < std::tie(b.offsets, b.file);
    });
    check_tiling(name, tensor);
  }
}

std::string ShardedTensors::file_name(size_t file) const { return base_name(files_[file].path); }

void ShardedTensors::check_tiling(const std::string& name, const Tensor& tensor) const {
  const auto box = box_shape(tensor.shape);
  const auto& pieces = tensor.pieces;  // sorted by offsets, so by offsets[0]
  // Overlaps: a sweep along dim 0, each piece against those still open at its first row.
  std::vector<const Piece*> open;
  for (const Piece& p : pieces) {
    open.erase(std::remove_if(open.begin(), open.end(),
                              [&](const Piece* a) { return a->offsets[0] + a->sizes[0] <= p.offsets[0]; }),
               open.end());
    for (const Piece* a : open) {
      std::vector<int64_t> lo(box.size()), size(box.size());
      bool meets = true;
      for (size_t d = 0; d < box.size(); ++d) {
        lo[d] = std::max(a->offsets[d], p.offsets[d]);
        size[d] = std::min(a->offsets[d] + a->sizes[d], p.offsets[d] + p.sizes[d]) - lo[d];
        meets = meets && size[d] > 0;
      }
      TANDEM_CHECK(!meets, where_, ": '", name, "' ", region_text(lo, size, box), " are in both ", file_name(a->file),
                   " and ", file_name(p.file), ": the shards overlap (files of two checkpoints mixed?)");
    }
    open.push_back(&p);
  }
  // Disjoint, so they cover it all exactly when their elements add up to its.
  int64_t covered = 0;
  for (const Piece& p : pieces) covered += volume(p.sizes);
  const int64_t whole = volume(box);
  if (covered == whole) return;
  // Name the first missing cell of the grid the pieces' edges draw (a cell is in one piece or none).
  std::vector<std::vector<int64_t>> edges(box.size());
  double cells = 1;
  for (size_t d = 0; d < box.size(); ++d) {
    edges[d] = {0, box[d]};
    for (const Piece& p : pieces) {
      edges[d].push_back(p.offsets[d]);
      edges[d].push_back(p.offsets[d] + p.sizes[d]);
    }
    std::sort(edges[d].begin(), edges[d].end());
    edges[d].erase(std::unique(edges[d].begin(), edges[d].end()), edges[d].end());
    cells *= static_cast<double>(edges[d].size() - 1);
  }
  TANDEM_CHECK(cells * static_cast<double>(pieces.size() + 1) < 5e7, where_, ": '", name, "': ", whole - covered,
               " of its ", whole, " elements are in no file: a shard is missing");
  std::vector<size_t> cell(box.size(), 0);
  while (true) {
    std::vector<int64_t> lo(box.size()), size(box.size());
    for (size_t d = 0; d < box.size(); ++d) {
      lo[d] = edges[d][cell[d]];
      size[d] = edges[d][cell[d] + 1] - lo[d];
    }
    const bool held = std::any_of(pieces.begin(), pieces.end(), [&](const Piece& p) {
      for (size_t d = 0; d < box.size(); ++d) {
        if (lo[d] < p.offsets[d] || lo[d] >= p.offsets[d] + p.sizes[d]) return false;
      }
      return true;
    });
    TANDEM_CHECK(held, where_, ": '", name, "' ", region_text(lo, size, box),
                 " are in no file: a shard is missing");
    size_t d = box.size();  // the next cell, last dimension fastest
    while (d > 0 && ++cell[d - 1] + 1 >= edges[d - 1].size()) cell[--d] = 0;
    if (d == 0) break;
  }
}

std::vector<std::string> ShardedTensors::names() const {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : tensors_) out.push_back(name);
  return out;
}

bool ShardedTensors::contains(const std::string& name) const { return tensors_.count(name) > 0; }

const ShardedTensors::Tensor& ShardedTensors::find(const std::string& name) const {
  auto it = tensors_.find(name);
  TANDEM_CHECK(it != tensors_.end(), where_, ": no tensor '", name, "'");
  return it->second;
}

const std::vector<int64_t>& ShardedTensors::shape(const std::string& name) const { return find(name).shape; }

at::ScalarType ShardedTensors::dtype(const std::string& name) const { return find(name).dtype; }

const std::string& ShardedTensors::file_of(const std::string& name) const {
  const Tensor& t = find(name);
  return files_[t.pieces.empty() ? t.first_file : t.pieces[0].file].path;
}

at::Tensor ShardedTensors::chunk(const std::string& name, const std::vector<int64_t>& offsets,
                                 const std::vector<int64_t>& sizes) const {
  const Tensor& t = find(name);
  // A 0-d tensor's own box (comm::local_chunk's) is its one row.
  if (t.shape.empty() && offsets.empty() && sizes.empty()) return chunk(name, {0}, {1}).reshape({});
  const auto box = box_shape(t.shape);
  bool inside = offsets.size() == box.size() && sizes.size() == box.size();
  for (size_t d = 0; inside && d < box.size(); ++d) {
    inside = offsets[d] >= 0 && sizes[d] >= 0 && offsets[d] <= box[d] && sizes[d] <= box[d] - offsets[d];
  }
  TANDEM_CHECK(inside, where_, ": '", name, "' is ", shape_text(t.shape), "; the box of ", shape_text(sizes), " at ",
               shape_text(offsets), " was asked for");
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(t.dtype));
  for (const Piece& p : t.pieces) {
    std::vector<int64_t> lo(box.size()), hi(box.size());
    bool meets = true;
    for (size_t d = 0; d < box.size(); ++d) {
      lo[d] = std::max(offsets[d], p.offsets[d]);
      hi[d] = std::min(offsets[d] + sizes[d], p.offsets[d] + p.sizes[d]);
      meets = meets && lo[d] < hi[d];
    }
    if (!meets) continue;
    // The piece's rows the box crosses (one read), then the columns within them.
    const SafetensorsIndex& index = files_[p.file];
    at::Tensor part = read_safetensors_rows(index, index.tensors[p.entry], lo[0] - p.offsets[0], hi[0] - lo[0])
                          .reshape(comm::rows_shape(p.sizes, hi[0] - lo[0]));
    at::Tensor into = out.narrow(0, lo[0] - offsets[0], hi[0] - lo[0]);
    for (size_t d = 1; d < box.size(); ++d) {
      const auto dim = static_cast<int64_t>(d);
      part = part.narrow(dim, lo[d] - p.offsets[d], hi[d] - lo[d]);
      into = into.narrow(dim, lo[d] - offsets[d], hi[d] - lo[d]);
    }
    into.copy_(part);
  }
  return out;
}

at::Tensor ShardedTensors::rows(const std::string& name, int64_t first, int64_t count) const {
  const Tensor& t = find(name);
  TANDEM_CHECK(first >= 0 && count >= 0 && first <= comm::row_count(t.shape) &&
                   count <= comm::row_count(t.shape) - first,
               where_, ": '", name, "' has ", comm::row_count(t.shape), " rows; rows ", first, " to ", first + count,
               " were asked for");
  std::vector<int64_t> offsets(box_shape(t.shape).size(), 0);
  offsets[0] = first;
  return chunk(name, offsets, rows_shape(box_shape(t.shape), count));
}

at::Tensor ShardedTensors::whole(const std::string& name) const {
  const Tensor& t = find(name);
  return chunk(name, std::vector<int64_t>(box_shape(t.shape).size(), 0), box_shape(t.shape)).reshape(t.shape);
}

}  // namespace tandem::accelerate
