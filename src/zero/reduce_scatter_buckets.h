#pragma once
// ZeRO-2's BucketReduction (Note [Bucket reduction] in tandem/ddp/bucket_reduction.h), which
// GradientShardedOptimizer installs in DDP's reducer.
//
// Note [Sharded gradients] (ZeRO-2)
// With it, the reducer keeps only this rank's share of the averaged gradient:
// - a bucket's flat layout is its parameters back to back, zero-padded to a multiple of the world
//   size W; rank r owns elements [r*m, (r+1)*m), m = padded / W (comm::ShardLayout);
// - the hook copies a gradient (times 1/W) into the bucket and drops the parameter's .grad, so
//   the full-size gradient lives only in the buckets, which exist from a bucket's first gradient
//   of a backward until the end of that backward, when their reduce-scatters are waited for (no
//   bucket is kept between iterations);
// - a full bucket is reduce-scattered (SUM) instead of all-reduced, still while backward runs,
//   into this rank's slice of it (the optimizer's tensor), which the next synced backward
//   overwrites;
// - no .grad is written back: the sharded optimizer steps the shards (Note [Flat shards]);
// - the buckets are the assignment given, never rebuilt (the optimizer's state lives in their
//   layout); communication hooks, gradient_as_bucket_view, find_unused_parameters,
//   static_graph and join() are refused;
// - under no_sync the hooks do nothing, so gradients accumulate whole in .grad as in plain DDP;
//   the synced backward then moves the accumulated sum into the bucket.
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"
#include "tandem/ddp/bucket_reduction.h"

namespace tandem::zero::detail {

class ReduceScatterBuckets : public ddp::BucketReduction {
 public:
  /// Bucket b is reduce-scattered into `slices[b]` (padded / W elements); `names`: the reducer's
  /// parameters', for messages.
  ReduceScatterBuckets(std::shared_ptr<comm::ProcessGroup> pg, std::vector<at::Tensor> slices,
                       std::vector<std::string> names);

  void check(const ddp::Reducer& reducer) const override;
  void register_comm_hook(const ddp::Reducer& reducer, ddp::CommHook hook) override;
  bool has_comm_hook() const override { return false; }
  void check_join() const override;
  bool passes_through_alone() const override { return false; }

  int64_t buffer_numel(int64_t numel) const override;
  bool keeps_buffers() const override { return false; }

  void fill(size_t index, at::Tensor& grad, at::Tensor& view, bool produced) override;
  std::unique_ptr<ddp::PendingReduction> launch(size_t index, ddp::Bucket& bucket, bool last) override;
  void finish(ddp::Bucket&, const at::Tensor&) override {}  // the result is the slice already
  void write_back(const std::vector<ddp::Bucket>&, std::vector<at::Tensor>&, const std::vector<bool>&) override {}
  void reset() override {}

 private:
  std::shared_ptr<comm::ProcessGroup> pg_;
  std::vector<at::Tensor> slices_;
  std::vector<std::string> names_;
  at::Tensor inverse_world_;  // 1/W as a wrapped CPU scalar
};

}  // namespace tandem::zero::detail
