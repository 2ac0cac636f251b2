#pragma once
// Note [Sharded files]
// A checkpoint's tensor may be cut into boxes across several safetensors files: every rank writes
// the piece it holds (FSDP's rows, a tensor-parallel column, any placement on a DeviceMesh:
// comm/placement.h), so that no process ever holds a whole model to save or load it. A file says
// which of its tensors are such pieces in its metadata:
//
//   "tandem_chunks": {"fc.weight": [[4, 3], [10, 5]], ...}    (JSON text: offsets, whole shape)
//
// The file's "fc.weight" then holds the box that starts at [4, 3] of a [10, 5] tensor, its shape
// the box's sizes: shape [3, 2] means rows 4 to 7 and columns 3 to 5. A 0-d tensor is one row: a
// piece of it has shape [1] (or [0]) and offsets [0]. A tensor the metadata does not list is
// whole. Every file is an ordinary safetensors file (Python reads each piece as it is); across the
// files of one set, every tensor's pieces must tile it exactly: none missing, none twice.
//
// Files of older Tandems say "tandem_rows": {"fc.weight": [4, [10, 5]]} (first row, whole shape;
// the piece is whole along every other dimension): read as the box [4, 0]. Writers write
// tandem_chunks only.
//
// ShardedTensors indexes such a set (headers only) and reads any box of any tensor from the
// pieces that hold it, so a rank reads its own piece whatever mesh wrote them.
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

/// The metadata keys of Note [Sharded files]: the one written, and the one older files have.
inline constexpr const char* kChunksMetadataKey = "tandem_chunks";
inline constexpr const char* kRowsMetadataKey = "tandem_rows";

/// One tensor a rank writes: `tensor` is the box of a tensor of `whole_shape` that starts at
/// `offsets` (for a whole tensor: offsets all 0, whole_shape its own shape).
struct ChunkPiece {
  std::string name;
  at::Tensor tensor;
  std::vector<int64_t> offsets;
  std::vector<int64_t> whole_shape;

  /// `tensor` is rows [first_row, first_row + tensor.size(0)) of a tensor of `whole_shape` (a 0-d
  /// tensor's piece: shape [1] or [0]).
  static ChunkPiece rows(std::string name, at::Tensor tensor, int64_t first_row, std::vector<int64_t> whole_shape);
};

/// The shape of `count` rows of a tensor of `shape` (the row rule's, comm/shard_layout.h).
using comm::rows_shape;

/// The files that hold model `model`'s tensors, by a checkpoint's state.json: its "model_files"
/// entry, or model_<m>.safetensors in checkpoints written before sharded models existed.
std::vector<std::string> model_files(const nlohmann::json& state, size_t model);

/// The safetensors bytes of `pieces`, with "format": "pt" and the chunks metadata for the pieces
/// that are not whole.
std::string chunk_pieces_bytes(const std::vector<ChunkPiece>& pieces);

class ShardedTensors {
 public:
  /// Indexes `paths` (headers only) and checks that every tensor's pieces agree on dtype and
  /// shape and tile it exactly. Throws tandem::Error, one line that starts with `where`.
  ShardedTensors(const std::vector<std::string>& paths, std::string where);

  /// Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  const std::vector<int64_t>& shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;
  /// The file that holds the tensor's first piece (for messages).
  const std::string& file_of(const std::string& name) const;

  /// The box of the tensor at `offsets` of `sizes` (comm::Chunk's; a 0-d tensor's: {} and {}, or
  /// its one row {0} and {1}); reads only the rows of each piece that the box crosses.
  at::Tensor chunk(const std::string& name, const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) const;
  /// Rows [first, first + count) of the tensor, shape [count, shape[1:]...] (a 0-d tensor's one
  /// row: [count]).
  at::Tensor rows(const std::string& name, int64_t first, int64_t count) const;
  /// The whole tensor, in its own shape.
  at::Tensor whole(const std::string& name) const;

 private:
  struct Piece {
    size_t file;
    size_t entry;
    std::vector<int64_t> offsets, sizes;  // the box, in box_shape(shape)'s dimensions
  };
  struct Tensor {
    std::vector<int64_t> shape;
    at::ScalarType dtype;
    size_t first_file;          // the first file that named it
    std::vector<Piece> pieces;  // sorted by offsets; the empty ones left out
  };
  const Tensor& find(const std::string& name) const;
  // Refuses, in one line, pieces that overlap or leave some of the tensor in no file.
  void check_tiling(const std::string& name, const Tensor& tensor) const;
  std::string file_name(size_t file) const;

  std::string where_;
  std::vector<SafetensorsIndex> files_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace tandem::accelerate
