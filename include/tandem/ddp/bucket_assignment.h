#pragma once
// Bucket assignment: which gradients travel together in one all-reduce. A pure function, apart
// from the stateful reducer, so it is tested without any process group (as c10d does).
//
// Note [Bucket assignment] (the rule of c10d's compute_bucket_assignment_by_size)
// - Walk the tensors in the given order. Each (dtype, device, group) has its own open bucket and its own
//   position in `size_limits`; a tensor joins the open bucket of its kind, and when that bucket
//   reaches its current limit it is closed and the kind moves to the next limit (the last limit
//   repeats). With limits {1 MB, 25 MB}, each kind's first bucket is small.
// - Open buckets are closed at the end.
// - Without `order`, buckets are sorted by the smallest tensor index they hold. DDP then reverses
//   the list, so that the buckets holding the last-registered parameters — whose gradients
//   backward produces first — are all-reduced first.
// - With `order` (rebuilding from the order gradients arrived), tensors are walked in that order
//   and buckets are kept in the order they were closed; the buckets still open at the end follow
//   in the order their kinds were first seen (PyTorch leaves that last order to a hash map).
#include <cstdint>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace tandem::ddp {

constexpr int64_t kDefaultBucketBytesCap = 25 * 1024 * 1024;
constexpr int64_t kDefaultFirstBucketBytes = 1024 * 1024;

struct TensorSpec {
  int64_t bytes = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  int64_t group = 0;  // tensors of different groups never share a bucket (ZeRO-2: param groups)
};

struct BucketAssignment {
  std::vector<std::vector<int64_t>> buckets;  // tensor indices per bucket
  std::vector<int64_t> size_limits;           // the limit each bucket was filled against
};

/// Throws tandem::Error when `size_limits` is empty or not positive, or `order` is not a
/// permutation of 0..tensors.size()-1.
BucketAssignment compute_bucket_assignment(const std::vector<TensorSpec>& tensors,
                                           const std::vector<int64_t>& size_limits,
                                           const std::vector<int64_t>& order = {});

}  // namespace tandem::ddp
