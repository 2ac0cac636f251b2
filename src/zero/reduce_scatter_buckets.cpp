#include "zero/reduce_scatter_buckets.h"

#include <ATen/ATen.h>

#include "common/record_stream.h"
#include "tandem/comm/shard_layout.h"
#include "tandem/ddp/reducer.h"
#include "tandem/error.h"

namespace tandem::zero::detail {
namespace {

class ReduceScatterInFlight : public ddp::PendingReduction {
 public:
  ReduceScatterInFlight(comm::ProcessGroup& pg, at::Tensor bucket, at::Tensor shard)
      : pg_(pg), bucket_(std::move(bucket)), shard_(std::move(shard)) {
    work_ = pg_.reduce_scatter_async(shard_, bucket_, comm::ReduceOp::Sum);
  }
  at::Tensor wait() override {
    pg_.wait(work_, "DDP gradient reduce_scatter of " + std::to_string(bucket_.numel()) + " " +
                        std::string(c10::toString(bucket_.scalar_type())));
    tandem::detail::record_on_current_stream(bucket_);
    return shard_;
  }

 private:
  comm::ProcessGroup& pg_;
  at::Tensor bucket_, shard_;
  c10::intrusive_ptr<c10d::Work> work_;
};

}  // namespace

ReduceScatterBuckets::ReduceScatterBuckets(std::shared_ptr<comm::ProcessGroup> pg, std::vector<at::Tensor> slices,
                                           std::vector<std::string> names)
    : pg_(std::move(pg)), slices_(std::move(slices)), names_(std::move(names)) {
  inverse_world_ = at::scalar_tensor(1.0 / pg_->size(), at::kDouble);
  inverse_world_.unsafeGetTensorImpl()->set_wrapped_number(true);
}

void ReduceScatterBuckets::check(const ddp::Reducer& reducer) const {
  const auto& options = reducer.options();
  TANDEM_CHECK(!reducer.configured(), "DDP: shard gradients (ZeRO-2) before the first forward");
  TANDEM_CHECK(!dynamic_cast<const ReduceScatterBuckets*>(&reducer.bucket_reduction()),
               "DDP: the gradients are sharded already (one ZeRO-2 optimizer per DDP model)");
  TANDEM_CHECK(!reducer.bucket_reduction().has_comm_hook(), "DDP: sharded gradients (ZeRO-2) are reduce-scattered as "
                                                            "they are; they cannot go through a communication hook");
  TANDEM_CHECK(!options.gradient_as_bucket_view(), "DDP: sharded gradients (ZeRO-2) keep no full-size gradient, so "
                                                   "there is no bucket view to make them: turn gradient_as_bucket_view off");
  TANDEM_CHECK(!options.find_unused_parameters() && !options.static_graph(),
               "DDP: sharded gradients (ZeRO-2) do not support find_unused_parameters or static_graph yet");
}

void ReduceScatterBuckets::register_comm_hook(const ddp::Reducer&, ddp::CommHook) {
  TANDEM_CHECK(false, "DDP: the gradients are sharded (ZeRO-2): they are reduce-scattered as they are, through no "
                      "communication hook");
}

void ReduceScatterBuckets::check_join() const {
  TANDEM_CHECK(false, "DDP: join() is not available with sharded gradients (ZeRO-2): a joined rank would have to "
                      "step its slices too; give every rank the same number of batches (even_batches, drop_last)");
}

int64_t ReduceScatterBuckets::buffer_numel(int64_t numel) const { return comm::ShardLayout{numel, pg_->size()}.padded(); }

void ReduceScatterBuckets::fill(size_t index, at::Tensor& grad, at::Tensor& view, bool /*produced*/) {
  // Into the bucket, pre-divided; the parameter keeps no gradient.
  TANDEM_CHECK(!grad.defined() || !grad.is_sparse(), "DDP: parameter ", index, " ('", names_[index],
               "') has a sparse gradient (e.g. Embedding(sparse=true)); ZeRO-2 shards dense gradients only: "
               "use a dense embedding, or zero_stage 1");
  if (grad.defined()) {
    at::mul_out(view, grad, inverse_world_);
    grad.reset();
  } else {
    view.zero_();
  }
}

std::unique_ptr<ddp::PendingReduction> ReduceScatterBuckets::launch(size_t index, ddp::Bucket& bucket, bool) {
  return std::make_unique<ReduceScatterInFlight>(*pg_, bucket.contents, slices_.at(index));
}

}  // namespace tandem::zero::detail
