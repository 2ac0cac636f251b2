#pragma once
// read_idx: one IDX file (the MNIST / Fashion-MNIST array format), gzip-compressed or plain, as a
// tensor of the file's element type and dimensions.
//
// The format (yann.lecun.com/exdb/mnist): a 4-byte magic — two zero bytes, the element type code,
// the number of dimensions — then each dimension as a big-endian uint32, then the elements in
// row-major order, big-endian. Type codes: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
// 0x0D float32, 0x0E float64; all six are read (multi-byte elements are converted to the host's
// byte order).
//
// Every malformed input is a one-line tandem::Error that names the file and says what was
// expected (docs/guide-data.md lists them): the file is missing or not a regular file; it is not
// IDX; its element type is unknown; a dimension is zero; the data would reach 2 GiB
// (kMaxIdxDataBytes); it holds fewer or more bytes than the header promises; the gzip stream is
// corrupt. No input makes it crash or allocate more than the file's promised size.
//
// Example:
//   at::Tensor labels = tandem::data::read_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
//   // labels: uint8, sizes [10000]
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace tandem::data {

/// The largest data section read_idx accepts, exclusive: 2 GiB.
constexpr int64_t kMaxIdxDataBytes = int64_t{1} << 31;

/// The IDX file at `path` (gzip or plain: the content decides, not the name) as a contiguous CPU
/// tensor with the file's element type and dimensions.
at::Tensor read_idx(const std::string& path);

}  // namespace tandem::data
