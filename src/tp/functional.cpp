#include "tandem/tp/functional.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <ATen/core/ivalue.h>

#include "tandem/error.h"

namespace tandem::tp {
namespace detail {
namespace {

int64_t checked_dim(const at::Tensor& x, int64_t dim, int64_t parts, const char* what) {
  TANDEM_CHECK(x.dim() > 0, "tp: ", what, " of a 0-d tensor: it has no dimension to cut");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TANDEM_CHECK(d >= 0 && d < x.dim(), "tp: ", what, " along dimension ", dim, " of a ", x.dim(), "-d tensor");
  TANDEM_CHECK(x.size(d) % parts == 0, "tp: ", what, " along dimension ", dim, " of size ", x.size(d),
               ", which does not divide among the ", parts, " ranks of the tensor-parallel group");
  return d;
}

}  // namespace

at::Tensor chunk_along(const at::Tensor& x, int64_t dim, const comm::ProcessGroup& group) {
  const int64_t d = checked_dim(x, dim, group.size(), "a chunk");
  const int64_t each = x.size(d) / group.size();
  return x.narrow(d, group.rank() * each, each).contiguous();
}

at::Tensor gather_along(const at::Tensor& x, int64_t dim, comm::ProcessGroup& group) {
  TANDEM_CHECK(x.dim() > 0, "tp: an all-gather of a 0-d tensor: it has no dimension to join along");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TANDEM_CHECK(d >= 0 && d < x.dim(), "tp: an all-gather along dimension ", dim, " of a ", x.dim(), "-d tensor");
  // Rank blocks back to back along dimension 0 are the concatenation along it.
  at::Tensor front = x.movedim(d, 0).contiguous();
  std::vector<int64_t> sizes = front.sizes().vec();
  sizes[0] *= group.size();
  at::Tensor out = at::empty(sizes, front.options());
  at::Tensor flat_in = front.view({-1});
  at::Tensor flat_out = out.view({-1});
  group.all_gather_into(flat_out, flat_in);
  return out.movedim(0, d).contiguous();
}

at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, comm::ProcessGroup& group) {
  const int64_t d = checked_dim(x, dim, group.size(), "a reduce-scatter");
  at::Tensor front = x.movedim(d, 0).contiguous();  // rank r's part: a contiguous block of rows
  std::vector<int64_t> sizes = front.sizes().vec();
  sizes[0] /= group.size();
  at::Tensor out = at::empty(sizes, front.options());
  at::Tensor flat_in = front.view({-1});
  at::Tensor flat_out = out.view({-1});
  group.reduce_scatter(flat_out, flat_in);
  return out.movedim(0, d).contiguous();
}

}  // namespace detail

namespace {

// The group rides in the autograd context as a capsule (saved_data holds IValues only).
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(Group g) : group(std::move(g)) {}
  Group group;
};

void save(torch::autograd::AutogradContext* ctx, const Group& group, int64_t dim) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
  ctx->saved_data["dim"] = dim;
}
comm::ProcessGroup& group_of(torch::autograd::AutogradContext* ctx) {
  return *static_cast<GroupCapsule*>(ctx->saved_data["group"].toCapsule().get())->group;
}
int64_t dim_of(torch::autograd::AutogradContext* ctx) { return ctx->saved_data["dim"].toInt(); }

enum class Move { Identity, AllReduce, Chunk, Gather, ReduceScatter };

at::Tensor move(Move how, const at::Tensor& x, int64_t dim, comm::ProcessGroup& group) {
  switch (how) {
    case Move::Identity:
      return x;
    case Move::AllReduce: {
      at::Tensor out = x.contiguous().clone();
      group.all_reduce(out);
      return out;
    }
    case Move::Chunk:
      return detail::chunk_along(x, dim, group);
    case Move::Gather:
      return detail::gather_along(x, dim, group);
    case Move::ReduceScatter:
      return detail::reduce_scatter_along(x, dim, group);
  }
  return x;
}

// One autograd function per (forward, backward) pair of movements.
template <Move Forward, Move Backward>
struct Movement : torch::autograd::Function<Movement<Forward, Backward>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, Group group, int64_t dim) {
    save(ctx, group, dim);
    return move(Forward, x, dim, *group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor grad = grads[0];
    if (grad.defined()) grad = move(Backward, grad, dim_of(ctx), group_of(ctx));
    return {grad, at::Tensor(), at::Tensor()};
  }
};

template <Move Forward, Move Backward>
at::Tensor apply(const at::Tensor& x, const Group& group, int64_t dim) {
  TANDEM_CHECK(group, "tp: no process group");
  TANDEM_CHECK(x.defined(), "tp: an undefined tensor");
  return Movement<Forward, Backward>::apply(x, group, dim);
}

}  // namespace

at::Tensor copy_to(const at::Tensor& x, const Group& group) {
  return apply<Move::Identity, Move::AllReduce>(x, group, 0);
}
at::Tensor reduce_from(const at::Tensor& x, const Group& group) {
  return apply<Move::AllReduce, Move::Identity>(x, group, 0);
}
at::Tensor scatter_to(const at::Tensor& x, int64_t dim, const Group& group) {
  return apply<Move::Chunk, Move::Gather>(x, group, dim);
}
at::Tensor gather_from(const at::Tensor& x, int64_t dim, const Group& group) {
  return apply<Move::Gather, Move::Chunk>(x, group, dim);
}
at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, const Group& group) {
  return apply<Move::ReduceScatter, Move::Gather>(x, group, dim);
}
at::Tensor all_gather(const at::Tensor& x, int64_t dim, const Group& group) {
  return apply<Move::Gather, Move::ReduceScatter>(x, group, dim);
}

}  // namespace tandem::tp
