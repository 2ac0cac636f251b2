#include "tandem/ddp/comm_hook.h"

#include <ATen/ATen.h>

#include "common/record_stream.h"

namespace tandem::ddp {
namespace {

// An all-reduce in flight, plus what to do with its result.
class AllReduceInFlight : public PendingReduction {
 public:
  AllReduceInFlight(comm::ProcessGroup& pg, at::Tensor tensor, std::function<at::Tensor(at::Tensor)> finish)
      : pg_(pg), tensor_(std::move(tensor)), finish_(std::move(finish)) {
    work_ = pg_.all_reduce_async(tensor_, comm::ReduceOp::Sum);
  }
  at::Tensor wait() override {
    pg_.wait(work_, "DDP gradient all_reduce of " + std::to_string(tensor_.numel()) + " " +
                        std::string(c10::toString(tensor_.scalar_type())));
    at::Tensor result = finish_ ? finish_(tensor_) : tensor_;
    // On CUDA the finish (and the reducer's copy of the result) is queued on the current stream,
    // which need not be the stream `tensor_` was allocated on (a hook's compressed copy is made
    // on the gradient's stream): its memory must not be handed out again before that work runs.
    tandem::detail::record_on_current_stream(tensor_);
    return result;
  }

 private:
  comm::ProcessGroup& pg_;
  at::Tensor tensor_;
  std::function<at::Tensor(at::Tensor)> finish_;
  c10::intrusive_ptr<c10d::Work> work_;
};

CommHook compress_hook(std::shared_ptr<comm::ProcessGroup> pg, at::ScalarType wire) {
  return [pg, wire](GradBucket& bucket) -> std::unique_ptr<PendingReduction> {
    at::Tensor compressed = bucket.buffer.to(wire).div_(pg->size());
    const auto original = bucket.buffer.scalar_type();
    return std::make_unique<AllReduceInFlight>(*pg, compressed,
                                               [original](at::Tensor t) { return t.to(original); });
  };
}

}  // namespace

// (A world of one never gets here without a hook: Note [World of one] in reducer.h.)
std::unique_ptr<PendingReduction> start_presummed_allreduce(comm::ProcessGroup& pg, at::Tensor bucket) {
  return std::make_unique<AllReduceInFlight>(pg, std::move(bucket), nullptr);
}

CommHook allreduce_hook(std::shared_ptr<comm::ProcessGroup> pg) {
  return [pg](GradBucket& bucket) -> std::unique_ptr<PendingReduction> {
    const int world = pg->size();
    return std::make_unique<AllReduceInFlight>(*pg, bucket.buffer,
                                               [world](at::Tensor t) { return t.div_(world); });
  };
}

CommHook fp16_compress_hook(std::shared_ptr<comm::ProcessGroup> pg) { return compress_hook(std::move(pg), at::kHalf); }
CommHook bf16_compress_hook(std::shared_ptr<comm::ProcessGroup> pg) { return compress_hook(std::move(pg), at::kBFloat16); }

}  // namespace tandem::ddp
