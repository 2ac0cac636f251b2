#pragma once
// Options of tandem::ddp::DistributedDataParallel, with PyTorch DDP's names and defaults.
#include <torch/arg.h>

#include "tandem/ddp/bucket_assignment.h"

namespace tandem::ddp {

constexpr double kDefaultBucketCapMb = 25.0;
constexpr double kDefaultFirstBucketMb = 1.0;

/// Options of DistributedDataParallel.
///
/// Example:
///   auto options = tandem::ddp::DistributedDataParallelOptions()
///                      .bucket_cap_mb(25)
///                      .gradient_as_bucket_view(true);
struct DistributedDataParallelOptions {
  /// Bucket size cap in MiB (PyTorch: bucket_cap_mb).
  TORCH_ARG(double, bucket_cap_mb) = kDefaultBucketCapMb;
  /// Cap of each dtype's first bucket in MiB: a small first bucket (Note [Bucket assignment]).
  TORCH_ARG(double, first_bucket_mb) = kDefaultFirstBucketMb;
  /// Broadcast buffers (e.g. BatchNorm statistics) from rank 0 before each synced forward.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Find parameters outside each iteration's graph, so their buckets still complete.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Make param.grad a view into its bucket: no second copy of the gradients.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  /// The set of used parameters is the same every iteration: find it once.
  TORCH_ARG(bool, static_graph) = false;
  /// Check the model on every rank and broadcast rank 0's parameters and buffers at construction.
  TORCH_ARG(bool, init_sync) = true;
};

/// The byte limits the first assignment uses: {first bucket, cap}, or {cap} when the first
/// bucket would not be smaller.
std::vector<int64_t> bucket_size_limits(const DistributedDataParallelOptions& options);

}  // namespace tandem::ddp
