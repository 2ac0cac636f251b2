#pragma once
// The reducer's default BucketReduction (Note [Bucket reduction]): PyTorch DDP's. Each gradient
// is copied into its slot times 1/W (or, with a communication hook, as it is), a full bucket is
// all-reduced with SUM (or handed to the hook), and after backward every used parameter's .grad
// is the average: a copy, or the bucket view itself with gradient_as_bucket_view (Note [Reducer]).
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"
#include "tandem/ddp/bucket_reduction.h"
#include "tandem/ddp/options.h"

namespace tandem::ddp::detail {

class AllReduceBuckets : public BucketReduction {
 public:
  AllReduceBuckets(std::shared_ptr<comm::ProcessGroup> pg, const DistributedDataParallelOptions& options,
                   size_t parameters);

  void check(const Reducer& reducer) const override;
  void register_comm_hook(const Reducer& reducer, CommHook hook) override;
  bool has_comm_hook() const override { return static_cast<bool>(hook_); }
  void check_join() const override {}
  bool passes_through_alone() const override { return !hook_; }

  int64_t buffer_numel(int64_t numel) const override { return numel; }
  bool keeps_buffers() const override { return true; }

  void fill(size_t index, at::Tensor& grad, at::Tensor& view, bool produced) override;
  std::unique_ptr<PendingReduction> launch(size_t index, Bucket& bucket, bool last) override;
  void finish(Bucket& bucket, const at::Tensor& result) override;
  void write_back(const std::vector<Bucket>& buckets, std::vector<at::Tensor>& parameters,
                  const std::vector<bool>& used_globally) override;
  void reset() override;

 private:
  std::shared_ptr<comm::ProcessGroup> pg_;
  bool bucket_view_ = false;        // gradient_as_bucket_view
  CommHook hook_;
  at::Tensor inverse_world_;        // 1/world_size as a wrapped CPU scalar: no allocation per gradient
  std::vector<at::Tensor> stashed_;  // unused parameters' gradients that are bucket views
};

}  // namespace tandem::ddp::detail
