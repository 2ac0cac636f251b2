#pragma once
// safetensors files, written and read exactly as Python's `safetensors` package does
// (docs/checkpoints.md): an 8-byte little-endian header length N, N bytes of JSON padded with
// spaces to a multiple of 8, then the raw little-endian bytes of every tensor, back to back.
//
//   {"__metadata__": {"format": "pt"},
//    "fc.weight": {"dtype": "F32", "shape": [10, 4], "data_offsets": [0, 160]}, ...}
//
// The dtypes are F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. Tensors are laid out as the package
// lays them out (descending dtype alignment, then name), so for the same tensors and metadata the
// file is byte for byte the one `safetensors.torch.save_file` writes.
//
// Example:
//   tandem::accelerate::save_safetensors("model.safetensors",
//       {{"fc.weight", fc->weight}, {"fc.bias", fc->bias}}, {{"format", "pt"}});
//   auto file = tandem::accelerate::load_safetensors("model.safetensors");
//   for (auto& [name, tensor] : file.tensors) { ... }
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem::accelerate {

/// The largest header the reader accepts, as the `safetensors` package (100 MB).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
/// The most dimensions a tensor may have, written or read (LibTorch programs use far fewer; the
/// bound keeps a malformed header from costing much memory).
constexpr size_t kSafetensorsMaxDimensions = 64;

/// What a safetensors file holds.
struct SafetensorsFile {
  /// The tensors in the order their bytes appear in the file, each a contiguous CPU tensor.
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  /// The header's "__metadata__" (string to string; empty when the file has none).
  std::map<std::string, std::string> metadata;
};

/// Writes `tensors` (any device, any strides: contiguous CPU copies are written) and `metadata`
/// (omitted from the header when empty) to `path`. Crash-safe: the bytes go to a temporary file
/// in the same directory, which is fsync'ed and renamed over `path`, and the directory is
/// fsync'ed; `path` is never a half-written file. Throws tandem::Error (one line, naming the file)
/// for a duplicate or non-UTF-8 name, an undefined, sparse or meta tensor, an unsupported dtype,
/// or a failed write.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The bytes save_safetensors would write for the same tensors and metadata (the same checks), in
/// memory: for a file that another process writes (a rank's optimizer shard, sent to the main one).
std::string safetensors_bytes(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

/// Reads a safetensors file strictly: any malformed header (truncated file, absurd header
/// length, invalid JSON, duplicate names, unknown dtype, shape that disagrees with its offsets,
/// offsets out of bounds, overlapping, leaving gaps or unused trailing bytes, a BOOL byte that is
/// not 0 or 1, non-string metadata) throws tandem::Error with a one-line message naming the file
/// and what is wrong. Never crashes, whatever the bytes.
SafetensorsFile load_safetensors(const std::string& path);

/// A safetensors file's header, checked exactly as load_safetensors checks it, without its data:
/// for reading parts of tensors (a rank's rows of a checkpoint's weights) without the whole file.
struct SafetensorsIndex {
  struct Entry {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t offset = 0;  // of its first byte, from the start of the file
  };
  std::string path;
  std::vector<Entry> tensors;  // in the order their bytes appear in the file
  std::map<std::string, std::string> metadata;
};

/// Reads and checks `path`'s header (and that the file's size fits it); reads no tensor data.
SafetensorsIndex index_safetensors(const std::string& path);

/// Rows [first, first + count) of dim 0 of `entry` (a tensor of `index`), as a contiguous CPU
/// tensor of shape [count, shape[1:]...]; a 0-d tensor is one row. Reads those bytes only.
/// Throws tandem::Error (one line) for rows outside the tensor or a file changed since indexed.
at::Tensor read_safetensors_rows(const SafetensorsIndex& index, const SafetensorsIndex::Entry& entry, int64_t first,
                                 int64_t count);

}  // namespace tandem::accelerate
