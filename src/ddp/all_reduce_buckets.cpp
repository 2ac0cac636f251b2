#include "ddp/all_reduce_buckets.h"

#include <ATen/ATen.h>

#include "tandem/ddp/reducer.h"
#include "tandem/error.h"

namespace tandem::ddp::detail {

AllReduceBuckets::AllReduceBuckets(std::shared_ptr<comm::ProcessGroup> pg,
                                   const DistributedDataParallelOptions& options, size_t parameters)
    : pg_(std::move(pg)), bucket_view_(options.gradient_as_bucket_view()), stashed_(parameters) {
  inverse_world_ = at::scalar_tensor(1.0 / pg_->size(), at::kDouble);
  inverse_world_.unsafeGetTensorImpl()->set_wrapped_number(true);
}

void AllReduceBuckets::check(const Reducer&) const {}  // the reducer's own: built with it

void AllReduceBuckets::register_comm_hook(const Reducer& reducer, CommHook hook) {
  TANDEM_CHECK(!hook_, "DDP: a communication hook is already registered (register it once)");
  TANDEM_CHECK(!reducer.configured(), "DDP: register the communication hook before the first forward");
  hook_ = std::move(hook);
}

void AllReduceBuckets::fill(size_t index, at::Tensor& grad, at::Tensor& view, bool produced) {
  if (!grad.defined()) {
    view.zero_();  // nothing here: contributes nothing to the average
  } else if (grad.is_alias_of(view)) {
    // An unused parameter must keep its gradient if no rank used it: the all-reduce will
    // overwrite the view, so keep the values aside.
    if (!produced) stashed_[index] = grad.clone();
    if (!hook_) view.div_(pg_->size());  // PyTorch divides in place when grad is the view
  } else {
    // Pre-divide while copying (PyTorch's mul by the reciprocal); a hook gets plain gradients.
    if (!hook_) {
      at::mul_out(view, grad, inverse_world_);
    } else {
      view.copy_(grad);
    }
    if (bucket_view_ && produced) grad = view;
  }
}

std::unique_ptr<PendingReduction> AllReduceBuckets::launch(size_t index, Bucket& bucket, bool last) {
  if (!hook_) return start_presummed_allreduce(*pg_, bucket.contents);
  GradBucket grad_bucket{index, bucket.contents, bucket.views, bucket.parameters, last};
  return hook_(grad_bucket);
}

void AllReduceBuckets::finish(Bucket& bucket, const at::Tensor& result) {
  if (!result.is_same(bucket.contents)) bucket.contents.copy_(result);
}

void AllReduceBuckets::write_back(const std::vector<Bucket>& buckets, std::vector<at::Tensor>& parameters,
                                  const std::vector<bool>& used_globally) {
  for (const auto& bucket : buckets) {
    for (size_t slot = 0; slot < bucket.parameters.size(); ++slot) {
      const size_t i = bucket.parameters[slot];
      const at::Tensor& view = bucket.views[slot];
      if (!used_globally[i]) {
        if (stashed_[i].defined()) view.copy_(stashed_[i]);  // the view is this parameter's .grad
        continue;
      }
      at::Tensor& grad = parameters[i].mutable_grad();
      if (bucket_view_) {
        if (!grad.defined() || !grad.is_alias_of(view)) grad = view;
      } else if (grad.defined()) {
        grad.copy_(view);
      } else {
        grad = view.clone();
      }
    }
  }
}

void AllReduceBuckets::reset() {
  for (auto& stash : stashed_) stash.reset();
}

}  // namespace tandem::ddp::detail
