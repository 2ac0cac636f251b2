#pragma once
// The collectives of tensor parallelism as differentiable functions (Megatron-LM's mappings; the
// redistributions PyTorch's DTensor makes between placements). Each moves a tensor between two
// layouts over a group, and its backward moves the gradient back:
//
//   function            forward                          backward
//   copy_to             identity (Replicate in)          all-reduce (the ranks' partial sums)
//   reduce_from         all-reduce (Partial -> Replicate) identity
//   scatter_to(d)       this rank's chunk along d        all-gather along d
//   gather_from(d)      all-gather along d               this rank's chunk along d
//   reduce_scatter(d)   reduce-scatter along d           all-gather along d
//   all_gather(d)       all-gather along d               reduce-scatter along d
//
// gather_from and all_gather differ only in what they assume of the gradient that comes back:
// the same on every rank (take this rank's chunk) or a partial sum (reduce-scatter it).
//
// Chunks follow the ranks' order in the group; the dimension d (negative counts from the end)
// must divide by the group's size: a one-line tandem::Error otherwise. Every rank of the group
// calls each function in the same order, as any collective.
#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"

namespace tandem::tp {

using Group = std::shared_ptr<comm::ProcessGroup>;

at::Tensor copy_to(const at::Tensor& x, const Group& group);
at::Tensor reduce_from(const at::Tensor& x, const Group& group);
at::Tensor scatter_to(const at::Tensor& x, int64_t dim, const Group& group);
at::Tensor gather_from(const at::Tensor& x, int64_t dim, const Group& group);
at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, const Group& group);
at::Tensor all_gather(const at::Tensor& x, int64_t dim, const Group& group);

namespace detail {
// The same movements without autograd (what the functions' forwards and backwards run).
at::Tensor chunk_along(const at::Tensor& x, int64_t dim, const comm::ProcessGroup& group);
at::Tensor gather_along(const at::Tensor& x, int64_t dim, comm::ProcessGroup& group);
at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, comm::ProcessGroup& group);
}  // namespace detail

}  // namespace tandem::tp
