#pragma once
// Internal: a contiguous piece of a flat buffer as a tensor of its own that shares the buffer's
// storage but is no autograd view. LibTorch's Optimizer::zero_grad calls detach_() on every
// gradient, which autograd refuses for views; DDP's bucket views and FSDP's shards and their
// gradients are such pieces.
#include <cstdint>

#include <ATen/ATen.h>

namespace tandem::detail {

inline at::Tensor storage_alias(const at::Tensor& buffer, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor alias = at::empty({0}, buffer.options().requires_grad(false));
  alias.set_(buffer.storage(), buffer.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return alias;
}

}  // namespace tandem::detail
