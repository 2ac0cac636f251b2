// Note [Shared conversions]: several layers often read one tensor (attention's q, k and v read the
// normalised input). Each ColwiseParallel copies its Replicate input into the tensor-parallel
// region (copy_to), whose backward all-reduces the gradient; three copies would all-reduce three
// times. So a conversion of a tensor that was just converted the same way returns the same
// result: the three layers' gradients add up on it, and one all-reduce carries their sum (one
// all-gather, for a sequence-sharded input). Entries hold the input and result weakly: a result
// lives as long as a graph that saved it, and nothing outlives the step.
#include "conversions.h"

#include <ATen/core/grad_mode.h>

#include "tandem/error.h"

namespace tandem::tp::detail {
namespace {

constexpr size_t kRemembered = 4;

int64_t positive(int64_t dim, const at::Tensor& x) { return dim < 0 ? dim + x.dim() : dim; }

}  // namespace

at::Tensor Conversions::run(const at::Tensor& x, Kind kind, int64_t dim, const Group& group) {
  switch (kind) {
    case Kind::CopyTo:
      return copy_to(x, group);
    case Kind::Scatter:
      return scatter_to(x, dim, group);
    case Kind::Gather:
      return gather_from(x, dim, group);
    case Kind::AllGather:
      return all_gather(x, dim, group);
  }
  return x;
}

at::Tensor Conversions::shared(const at::Tensor& x, Kind kind, int64_t dim) {
  const bool grad_mode = at::GradMode::is_enabled();
  const uint32_t version = x.is_inference() ? 0 : x._version();
  for (const Entry& e : recent_) {
    if (e.kind != kind || e.dim != dim || e.grad_mode != grad_mode || e.version != version) continue;
    auto input = e.input.lock();
    if (!input || input.get() != x.unsafeGetTensorImpl()) continue;
    auto output = e.output.lock();
    if (output) return at::Tensor(std::move(output));
  }
  at::Tensor out = run(x, kind, dim, group_);
  if (recent_.size() == kRemembered) recent_.erase(recent_.begin());
  recent_.push_back({c10::weak_intrusive_ptr<c10::TensorImpl>(x.getIntrusivePtr()), version, kind, dim, grad_mode,
                     c10::weak_intrusive_ptr<c10::TensorImpl>(out.getIntrusivePtr())});
  return out;
}

at::Tensor Conversions::input(const at::Tensor& x, const comm::Placement& from, const comm::Placement& to,
                              const std::string& module, bool differentiable) {
  using Kind_ = comm::Placement::Kind;
  TANDEM_CHECK(from.kind != Kind_::Partial && to.kind != Kind_::Partial, "tp: '", module,
               "': an input layout Partial(): inputs are Replicate() or Shard(d)");
  if (from.kind == Kind_::Replicate) check_replicated(x, module);
  if (!differentiable) {  // token ids: moved as they are, no gradient to carry
    if (from == to) return x;
    if (to.kind == Kind_::Replicate) return gather_along(x, from.dim, *group_);
    TANDEM_CHECK(from.kind == Kind_::Replicate, "tp: '", module, "': an input from ", from.str(), " to ", to.str());
    return chunk_along(x, to.dim, *group_);
  }
  if (from.kind == Kind_::Replicate && to.kind == Kind_::Replicate) return shared(x, Kind::CopyTo, 0);
  if (from.kind == Kind_::Replicate) return shared(x, Kind::Scatter, positive(to.dim, x));
  if (to.kind == Kind_::Replicate) return shared(x, Kind::AllGather, positive(from.dim, x));
  TANDEM_CHECK(positive(from.dim, x) == positive(to.dim, x), "tp: '", module, "': an input from ", from.str(), " to ",
               to.str(), " (moving a shard between dimensions is not supported)");
  return x;
}

at::Tensor Conversions::output(const at::Tensor& x, const comm::Placement& from, const comm::Placement& to,
                               const std::string& module) {
  using Kind_ = comm::Placement::Kind;
  TANDEM_CHECK(to.kind != Kind_::Partial, "tp: '", module, "': an output layout Partial(): outputs are Replicate() or Shard(d)");
  if (from.kind == Kind_::Partial) {
    if (to.kind == Kind_::Replicate) return reduce_from(x, group_);
    return reduce_scatter(x, positive(to.dim, x), group_);
  }
  if (from == to || (from.is_shard() && to.is_shard() && positive(from.dim, x) == positive(to.dim, x))) return x;
  if (to.kind == Kind_::Replicate) return gather_from(x, positive(from.dim, x), group_);
  TANDEM_CHECK(from.kind == Kind_::Replicate, "tp: '", module, "': an output from ", from.str(), " to ", to.str(),
               " (moving a shard between dimensions is not supported)");
  return scatter_to(x, positive(to.dim, x), group_);
}

void Conversions::check_replicated(const at::Tensor& x, const std::string& module) {
  if (group_->size() == 1 || !checked_.insert(module).second) return;
  at::NoGradGuard no_grad;
  const at::Tensor values = x.detach().to(at::kDouble).reshape({-1});
  const at::Tensor positions = at::arange(values.numel(), values.options());
  at::Tensor mine = at::stack({at::scalar_tensor(static_cast<double>(values.numel()), values.options()),
                               values.sum(), (values * values).sum(), (values * positions).sum()})
                        .to(x.device());
  const auto everyone = group_->all_gather(mine);
  for (int r = 0; r < group_->size(); ++r) {
    if (at::equal(everyone[r], everyone[0])) continue;
    throw Error(message("tp: the input of '", module, "' differs across the tensor-parallel group (", group_->describe_rank(r),
                " has another than ", group_->describe_rank(0),
                "): every rank of a tp group must run on the same batch; shard the data over the data-parallel "
                "dimensions only"));
  }
}

}  // namespace tandem::tp::detail
