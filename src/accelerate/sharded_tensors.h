#pragma once
// Note [Row-sharded files]
// A checkpoint's tensor may be cut along dim 0 across several safetensors files: under FSDP every
// rank writes the rows it holds, so that no process ever holds a whole model to save or load it.
// A file says which of its tensors are such pieces in its metadata:
//
//   "tandem_rows": {"fc.weight": [4, [10, 3]], ...}     (JSON text: first row, whole shape)
//
// The file's "fc.weight" then holds rows [4, 4 + n) of a [10, 3] tensor, with shape [n, 3] (a 0-d
// tensor is one row: its piece has shape [1]). A tensor the metadata does not list is whole. Every
// file is an ordinary safetensors file (Python reads each piece as it is); across the files of one
// set, every tensor's pieces must tile its rows exactly: none missing, none twice.
// ShardedTensors indexes such a set (headers only) and reads any rows of any tensor from the
// pieces that hold them, so a rank reads its own rows whatever world size wrote them.
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "tandem/accelerate/safetensors.h"
#include "tandem/comm/shard_layout.h"

namespace tandem::accelerate {

/// The metadata key of Note [Row-sharded files].
inline constexpr const char* kRowsMetadataKey = "tandem_rows";

/// One tensor a rank writes: `tensor` holds rows [first_row, first_row + tensor.size(0)) of a
/// tensor of `whole_shape` (for a whole tensor: first_row 0, whole_shape its own shape).
struct RowPiece {
  std::string name;
  at::Tensor tensor;
  int64_t first_row = 0;
  std::vector<int64_t> whole_shape;
};

/// The shape of `count` rows of a tensor of `shape` (the row rule's, comm/shard_layout.h).
using comm::rows_shape;

/// The files that hold model `model`'s tensors, by a checkpoint's state.json: its "model_files"
/// entry, or model_<m>.safetensors in checkpoints written before sharded models existed.
std::vector<std::string> model_files(const nlohmann::json& state, size_t model);

/// The safetensors bytes of `pieces`, with "format": "pt" and the rows metadata for the pieces
/// that are not whole.
std::string row_pieces_bytes(const std::vector<RowPiece>& pieces);

class ShardedTensors {
 public:
  /// Indexes `paths` (headers only) and checks that every tensor's pieces agree on dtype and
  /// shape and tile its rows exactly. Throws tandem::Error, one line that starts with `where`.
  ShardedTensors(const std::vector<std::string>& paths, std::string where);

  /// Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  const std::vector<int64_t>& shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;
  /// The file that holds the tensor's first rows (for messages).
  const std::string& file_of(const std::string& name) const;

  /// Rows [first, first + count) of the tensor, shape [count, shape[1:]...] (a 0-d tensor's one
  /// row: [count]); reads only the bytes of those rows.
  at::Tensor rows(const std::string& name, int64_t first, int64_t count) const;
  /// The whole tensor, in its own shape.
  at::Tensor whole(const std::string& name) const;

 private:
  struct Piece {
    size_t file;
    size_t entry;
    int64_t first_row, rows;
  };
  struct Tensor {
    std::vector<int64_t> shape;
    at::ScalarType dtype;
    size_t first_file;          // the first file that named it
    std::vector<Piece> pieces;  // sorted by first_row, tiling [0, rows)
  };
  const Tensor& find(const std::string& name) const;

  std::string where_;
  std::vector<SafetensorsIndex> files_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace tandem::accelerate
