#pragma once
// Communication hooks: how one bucket of gradients is reduced across ranks.
//
// Note [DDP communication hook]
// Without a hook, the reducer pre-divides each gradient by the world size while copying it into
// the bucket and all-reduces with SUM. With a hook, the bucket holds the plain local gradients
// and the hook owns the whole reduction, division included: it starts the communication and
// returns a handle whose wait() gives the averaged bucket (which the reducer copies back into the
// bucket when it is another tensor). Buckets are launched in index order on every rank, so hooks
// that issue collectives stay matched across ranks.
//
// Example:
//   ddp->register_comm_hook(tandem::ddp::fp16_compress_hook(pg));
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"

namespace tandem::ddp {

struct GradBucket {
  size_t index = 0;
  at::Tensor buffer;                    // flat, one dtype and device
  std::vector<at::Tensor> gradients;    // views of `buffer`, one per parameter
  std::vector<size_t> parameter_indices;
  bool is_last = false;
};

class PendingReduction {
 public:
  virtual ~PendingReduction() = default;
  /// Blocks (or, on CUDA, orders the current stream) until done; returns the averaged bucket.
  virtual at::Tensor wait() = 0;
};

using CommHook = std::function<std::unique_ptr<PendingReduction>(GradBucket& bucket)>;

/// All-reduce the bucket, then divide by the world size (PyTorch's allreduce_hook).
CommHook allreduce_hook(std::shared_ptr<comm::ProcessGroup> pg);
/// Cast to float16, divide, all-reduce, cast back (PyTorch's fp16_compress_hook).
CommHook fp16_compress_hook(std::shared_ptr<comm::ProcessGroup> pg);
/// Same with bfloat16 (PyTorch's bf16_compress_hook).
CommHook bf16_compress_hook(std::shared_ptr<comm::ProcessGroup> pg);

/// The reducer's path without a hook: SUM of an already pre-divided bucket.
std::unique_ptr<PendingReduction> start_presummed_allreduce(comm::ProcessGroup& pg, at::Tensor bucket);

}  // namespace tandem::ddp
