#include "accelerate/sharded_tensors.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include <nlohmann/json.hpp>

#include "tandem/error.h"

namespace tandem::accelerate {
namespace {

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

}  // namespace

std::vector<std::string> model_files(const nlohmann::json& state, size_t model) {
  if (!state.contains("model_files")) return {"model_" + std::to_string(model) + ".safetensors"};
  return state.at("model_files").at(model).get<std::vector<std::string>>();
}

std::string row_pieces_bytes(const std::vector<RowPiece>& pieces) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json rows = nlohmann::json::object();
  for (const auto& p : pieces) {
    tensors.emplace_back(p.name, p.tensor);
    if (p.first_row != 0 || p.tensor.sizes() != c10::IntArrayRef(p.whole_shape)) {
      rows[p.name] = {p.first_row, p.whole_shape};
    }
  }
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  if (!rows.empty()) metadata[kRowsMetadataKey] = rows.dump();
  return safetensors_bytes(tensors, metadata);
}

ShardedTensors::ShardedTensors(const std::vector<std::string>& paths, std::string where) : where_(std::move(where)) {
  for (size_t f = 0; f < paths.size(); ++f) {
    files_.push_back(index_safetensors(paths[f]));
    const SafetensorsIndex& index = files_.back();
    const std::string file = base_name(paths[f]);
    nlohmann::json rows = nlohmann::json::object();
    if (auto it = index.metadata.find(kRowsMetadataKey); it != index.metadata.end()) {
      try {
        rows = nlohmann::json::parse(it->second);
      } catch (const nlohmann::json::exception&) {
        throw Error(message(where_, ": ", file, ": its ", kRowsMetadataKey, " metadata is not valid JSON"));
      }
      TANDEM_CHECK(rows.is_object(), where_, ": ", file, ": its ", kRowsMetadataKey, " metadata is not a JSON object");
    }
    std::map<std::string, size_t> entry_of;
    for (size_t e = 0; e < index.tensors.size(); ++e) entry_of[index.tensors[e].name] = e;
    for (const auto& [name, value] : rows.items()) {
      TANDEM_CHECK(entry_of.count(name), where_, ": ", file, ": ", kRowsMetadataKey, " names '", name,
                   "', which the file does not hold");
    }
    for (size_t e = 0; e < index.tensors.size(); ++e) {
      const auto& entry = index.tensors[e];
      std::vector<int64_t> shape = entry.shape;
      int64_t first = 0;
      if (rows.contains(entry.name)) {
        const auto& v = rows[entry.name];
        // Numbers as JSON gives them (unsigned 64-bit), each at most INT64_MAX: no input wraps.
        auto fits = [](const nlohmann::json& x) {
          return x.is_number_unsigned() && x.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
        };
        bool valid = v.is_array() && v.size() == 2 && fits(v[0]) && v[1].is_array();
        if (valid) {
          shape.clear();
          for (const auto& d : v[1]) {
            valid = valid && fits(d);
            if (valid) shape.push_back(d.get<int64_t>());
          }
          first = valid ? v[0].get<int64_t>() : 0;
        }
        TANDEM_CHECK(valid, where_, ": ", file, ": the rows of '", entry.name,
                     "' are not [first row, [whole shape]]");
        // The piece is [n, shape[1:]...] (a 0-d tensor's rows: [n]) and lies within the rows.
        const std::vector<int64_t> expected = comm::rows_shape(shape, entry.shape.empty() ? -1 : entry.shape[0]);
        TANDEM_CHECK(entry.shape.size() == expected.size() && entry.shape == expected &&
                         first <= comm::row_count(shape) && entry.shape[0] <= comm::row_count(shape) - first,
                     where_, ": ", file, ": '", entry.name, "' is ", shape_text(entry.shape), " from row ", first,
                     ", which is not rows of a ", shape_text(shape), " tensor");
      }
      const int64_t n = rows.contains(entry.name) ? entry.shape[0] : comm::row_count(shape);
      auto [it, fresh] = tensors_.try_emplace(entry.name, Tensor{shape, entry.dtype, f, {}});
      TANDEM_CHECK(it->second.shape == shape && it->second.dtype == entry.dtype, where_, ": '", entry.name, "' is ",
                   c10::toString(entry.dtype), shape_text(shape), " in ", file, " but ", c10::toString(it->second.dtype),
                   shape_text(it->second.shape), " in ", base_name(files_[it->second.first_file].path),
                   ": files of two checkpoints mixed?");
      (void)fresh;
      if (n > 0 || comm::row_count(shape) == 0) it->second.pieces.push_back({f, e, first, n});
    }
  }
  for (auto& [name, tensor] : tensors_) {
    auto& pieces = tensor.pieces;
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
      return std::tie(a.first_row, a.file) < std::tie(b.first_row, b.file);
    });
    int64_t next = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      TANDEM_CHECK(p.first_row >= next, where_, ": '", name, "' rows ", p.first_row, " to ",
                   std::min(next, p.first_row + p.rows), " are in both ", base_name(files_[pieces[i - 1].file].path),
                   " and ", base_name(files_[p.file].path), ": the shards overlap (files of two checkpoints mixed?)");
      TANDEM_CHECK(p.first_row == next, where_, ": '", name, "' rows ", next, " to ", p.first_row,
                   " are in no file: a shard is missing");
      next = p.first_row + p.rows;
    }
    TANDEM_CHECK(next == comm::row_count(tensor.shape), where_, ": '", name, "' rows ", next, " to ",
                 comm::row_count(tensor.shape), " are in no file: a shard is missing");
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

at::Tensor ShardedTensors::rows(const std::string& name, int64_t first, int64_t count) const {
  const Tensor& t = find(name);
  TANDEM_CHECK(first >= 0 && count >= 0 && first + count <= comm::row_count(t.shape), where_, ": '", name, "' has ",
               comm::row_count(t.shape), " rows; rows ", first, " to ", first + count, " were asked for");
  at::Tensor out = at::empty(rows_shape(t.shape, count), at::TensorOptions().dtype(t.dtype));
  for (const Piece& p : t.pieces) {
    const int64_t lo = std::max(first, p.first_row), hi = std::min(first + count, p.first_row + p.rows);
    if (lo >= hi) continue;
    const SafetensorsIndex& index = files_[p.file];
    at::Tensor part = read_safetensors_rows(index, index.tensors[p.entry], lo - p.first_row, hi - lo);
    out.narrow(0, lo - first, hi - lo).copy_(part.reshape(out.narrow(0, lo - first, hi - lo).sizes()));
  }
  return out;
}

at::Tensor ShardedTensors::whole(const std::string& name) const {
  const Tensor& t = find(name);
  return rows(name, 0, comm::row_count(t.shape)).reshape(t.shape);
}

}  // namespace tandem::accelerate
