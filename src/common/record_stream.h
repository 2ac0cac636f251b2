#pragma once
// Internal: Tensor.record_stream(current stream) without a CUDA header, for the code that frees
// or reuses a tensor after queuing work that reads it on another stream than its own.
#include <ATen/core/Tensor.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace tandem::detail {

/// `t` was read by work queued on its device's current stream: the caching allocator must not
/// hand its memory out again before that work is done (a no-op on CPU, and on the stream `t` was
/// allocated on).
inline void record_on_current_stream(const at::Tensor& t) {
  if (!t.is_cuda() || t.layout() != c10::kStrided || !t.has_storage()) return;
  const c10::impl::VirtualGuardImpl impl(t.device().type());
  impl.recordDataPtrOnStream(t.storage().data_ptr(), impl.getStream(t.device()));
}

}  // namespace tandem::detail
