// Note [Shared conversions]: several layers often read one tensor (attention's q, k and v read the
// normalised input). Each ColwiseParallel copies its Replicate input into the tensor-parallel
// region (copy_to), whose backward all-reduces the gradient; three copies would all-reduce three
// times. So a conversion of a tensor that was just converted the same way returns the same
// result: the three layers' gradients add up on it, and one all-reduce carries their sum (one
// all-gather, for a sequence-sharded input). Entries hold the input and result weakly: a result
// lives as long as a graph that saved it, and nothing outlives the step.
#include "conversions.h"

#include <algorithm>

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
    case Kind::AllGather:
      return all_gather(x, dim, group);
  }
  return x;
}

at::Tensor Conversions::shared(const at::Tensor& x, Kind kind, int64_t dim) {
  const bool grad_mode = at::GradMode::is_enabled();
  // Inference tensors keep no version: never shared.
  const bool versioned = !x.is_inference();
  const int64_t version = versioned ? x._version() : 0;
  for (const Entry& e : recent_) {
    if (!versioned || e.kind != kind || e.dim != dim || e.grad_mode != grad_mode || e.version != version) continue;
    auto input = e.input.lock();
    if (!input || input.get() != x.unsafeGetTensorImpl()) continue;
    auto output = e.output.lock();
    if (!output) continue;
    at::Tensor out(std::move(output));
    if (out._version() == e.output_version) return out;
  }
  at::Tensor out = run(x, kind, dim, group_);
  if (!versioned || out.is_inference()) return out;
  if (recent_.size() == kRemembered) recent_.erase(recent_.begin());
  recent_.push_back({c10::weak_intrusive_ptr<c10::TensorImpl>(x.getIntrusivePtr()), version, kind, dim, grad_mode,
                     c10::weak_intrusive_ptr<c10::TensorImpl>(out.getIntrusivePtr()), out._version()});
  return out;
}

at::Tensor Conversions::input(const at::Tensor& x, const comm::Placement& from, const comm::Placement& to,
                              const std::string& module, bool differentiable) {
  using Kind_ = comm::Placement::Kind;
  TANDEM_CHECK(to.kind != Kind_::Partial, "tp: '", module,
               "': a desired input layout Partial(): a module takes Replicate() or Shard(d)");  // styles check first
  if (from.kind == Kind_::Partial) {
    // Each rank holds a summand (PyTorch's PrepareModuleInput from Partial): reduced as an output
    // is, all-reduce to Replicate or reduce-scatter to Shard(d); the gradient goes back as it
    // came (DTensor keeps a Partial's gradient Replicate).
    TANDEM_CHECK(differentiable, "tp: '", module, "': a Partial() input of integers (token ids cannot be summed)");
    if (to.kind == Kind_::Replicate) return reduce_from(x, group_);
    return reduce_scatter(x, positive(to.dim, x), group_);
  }
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
  if (group_->size() == 1 || checked_.count(module)) return;
  at::NoGradGuard no_grad;
  // A fingerprint of the bytes, in integer arithmetic: the same on every rank for the same tensor
  // whatever its values (NaN included) and however many threads add it up. Taken a slice of 1 MiB
  // at a time, so that it needs 16 MiB beside the input whatever the input's size (all at once, it
  // took 24 bytes per input byte on the device: a 1 GiB batch, 24 GiB at the first forward).
  constexpr int64_t kSlice = int64_t{1} << 20;
  const at::Tensor all_bytes = x.detach().contiguous().view({-1}).view(at::kByte);
  const auto longs = all_bytes.options().dtype(at::kLong);
  at::Tensor sum = at::zeros({}, longs), weighted = at::zeros({}, longs);
  for (int64_t at_byte = 0; at_byte < all_bytes.numel(); at_byte += kSlice) {
    const int64_t n = std::min(kSlice, all_bytes.numel() - at_byte);
    const at::Tensor bytes = all_bytes.narrow(0, at_byte, n).to(at::kLong);
    const at::Tensor weights = at::arange(at_byte, at_byte + n, longs).remainder_(65521).add_(1);
    sum.add_(bytes.sum());
    weighted.add_((bytes * weights).sum());
  }
  at::Tensor mine = at::stack({at::scalar_tensor(x.numel(), longs),
                               at::scalar_tensor(static_cast<int64_t>(x.scalar_type()), longs), sum, weighted});
  const auto everyone = group_->all_gather(mine);
  checked_.insert(module);
  for (int r = 0; r < group_->size(); ++r) {
    if (at::equal(everyone[r], everyone[0])) continue;
    throw Error(message("tp: the input of '", module, "' differs across the tensor-parallel group (", group_->describe_rank(r),
                " has another than ", group_->describe_rank(0),
                "): every rank of a tp group must run on the same batch; shard the data over the data-parallel "
                "dimensions only"));
  }
}

}  // namespace tandem::tp::detail
