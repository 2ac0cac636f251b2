#include "tandem/ddp/reducer.h"

#include <algorithm>
#include <unordered_set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include "../common/ready_hook.h"
#include "tandem/error.h"

namespace tandem::ddp {
namespace {

using torch::autograd::Node;

std::vector<TensorSpec> specs_of(const std::vector<at::Tensor>& parameters) {
  std::vector<TensorSpec> specs;
  specs.reserve(parameters.size());
  for (const auto& p : parameters) {
    specs.push_back(TensorSpec{static_cast<int64_t>(p.numel() * p.element_size()), p.scalar_type(), p.device()});
  }
  return specs;
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                 std::shared_ptr<comm::ProcessGroup> pg, DistributedDataParallelOptions options)
    : parameters_(std::move(parameters)), names_(std::move(names)), pg_(std::move(pg)), options_(options) {
  if (parameters_.empty()) throw Error("DDP: the module has no parameter that requires a gradient");
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!parameters_[i].is_contiguous()) {
      throw Error("DDP: parameter " + std::to_string(i) + " ('" + names_[i] + "') is not contiguous");
    }
  }
  // Note [Bucket assignment]: sorted by first parameter, then reversed so that the buckets of
  // the last-registered parameters (whose gradients come first) are launched first.
  BucketAssignment assignment = compute_bucket_assignment(specs_of(parameters_), bucket_size_limits(options_));
  std::reverse(assignment.buckets.begin(), assignment.buckets.end());
  std::reverse(assignment.size_limits.begin(), assignment.size_limits.end());
  build_buckets(assignment);

  ready_.assign(parameters_.size(), false);
  used_locally_.assign(parameters_.size(), 0);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[i]);
    hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<tandem::detail::ReadyHook>([this, i] { autograd_hook(i); })));
    grad_accumulators_.push_back(std::move(accumulator));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < grad_accumulators_.size(); ++i) grad_accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::build_buckets(const BucketAssignment& assignment) {
  at::NoGradGuard no_grad;
  std::vector<Bucket> buckets(assignment.buckets.size());
  locator_.assign(parameters_.size(), {0, 0});
  for (size_t b = 0; b < assignment.buckets.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.size_limit = assignment.size_limits[b];
    int64_t total = 0;
    for (auto index : assignment.buckets[b]) total += parameters_[static_cast<size_t>(index)].numel();
    const auto& first = parameters_[static_cast<size_t>(assignment.buckets[b].front())];
    bucket.contents = at::zeros({total}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (auto index : assignment.buckets[b]) {
      const auto i = static_cast<size_t>(index);
      auto& param = parameters_[i];
      // An alias of the bucket's storage, not an autograd view: LibTorch's Optimizer::zero_grad
      // calls detach_() on every gradient, which autograd refuses for views.
      at::Tensor view = at::empty({0}, bucket.contents.options());
      view.set_(bucket.contents.storage(), bucket.contents.storage_offset() + offset, param.sizes(),
                c10::contiguous_strides(param.sizes()));
      offset += param.numel();
      locator_[i] = {b, bucket.parameters.size()};
      bucket.parameters.push_back(i);
      bucket.views.push_back(view);
      if (options_.gradient_as_bucket_view() && param.grad().defined()) {
        view.copy_(param.grad());
        param.mutable_grad() = view;
      }
    }
    bucket.pending = bucket.parameters.size();
  }
  buckets_ = std::move(buckets);
  ++bucket_builds_;
}

void Reducer::register_comm_hook(CommHook hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm_hook_) throw Error("DDP: a communication hook is already registered (register it once)");
  if (iteration_ > 0 || awaiting_backward_) throw Error("DDP: register the communication hook before the first forward");
  comm_hook_ = std::move(hook);
}

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (awaiting_backward_) {
    throw Error("DDP: forward() was called again before the last synced forward's backward() reduced its "
                "gradients; call backward() once per forward(), or run extra forwards under "
                "at::NoGradGuard or inside no_sync()");
  }
  if (!rebuild_pending_) return;
  // Rank 0's arrival order, so every rank builds the same buckets. Parameters that never arrived
  // (unused) go last, in reverse registration order.
  std::vector<int64_t> order = arrival_order_;
  std::vector<bool> arrived(parameters_.size(), false);
  for (auto i : order) arrived[static_cast<size_t>(i)] = true;
  for (size_t i = parameters_.size(); i-- > 0;) {
    if (!arrived[i]) order.push_back(static_cast<int64_t>(i));
  }
  at::Tensor shared = at::tensor(order, at::kLong);
  pg_->broadcast(shared, 0);
  order.assign(shared.data_ptr<int64_t>(), shared.data_ptr<int64_t>() + shared.numel());
  build_buckets(compute_bucket_assignment(specs_of(parameters_), bucket_size_limits(options_), order));
  reset_iteration();
  rebuild_pending_ = false;
  arrival_order_.clear();  // recorded in the first iteration only; not needed again
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  expect_hooks_ = true;
  awaiting_backward_ = true;
  const bool search = options_.find_unused_parameters() || (options_.static_graph() && !unused_known_);
  if (!search) return;
  // Every node reachable from the outputs; a parameter whose AccumulateGrad is not among them
  // gets no gradient in this backward.
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    if (auto fn = out.grad_fn()) {
      stack.push_back(fn.get());
    } else if (auto acc = torch::autograd::impl::try_get_grad_accumulator(out)) {
      stack.push_back(acc.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  unused_.clear();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!seen.count(grad_accumulators_[i].get())) unused_.push_back(i);
  }
  if (options_.static_graph()) unused_known_ = true;
}

void Reducer::autograd_hook(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!expect_hooks_) return;  // no_sync, or a backward not started from a synced forward
  if (!finalize_queued_) {
    finalize_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
    for (auto unused : unused_) {
      if (!ready_[unused]) mark_ready(unused);
    }
  }
  if (ready_[index]) {
    throw Error("DDP: parameter " + std::to_string(index) + " ('" + names_[index] +
                "') received a second gradient in one backward; DDP reduces each gradient once per iteration");
  }
  if (iteration_ == 0) arrival_order_.push_back(static_cast<int64_t>(index));
  mark_ready(index);
}

void Reducer::mark_ready(size_t index) {
  at::NoGradGuard no_grad;
  auto [b, slot] = locator_[index];
  Bucket& bucket = buckets_[b];
  at::Tensor& view = bucket.views[slot];
  at::Tensor& grad = parameters_[index].mutable_grad();
  const double world = pg_->size();
  if (!grad.defined()) {
    view.zero_();  // unused here: contributes nothing to the average
  } else {
    used_locally_[index] = 1;
    if (grad.is_alias_of(view)) {
      if (!comm_hook_) view.div_(world);  // PyTorch divides in place when grad is the view
    } else {
      // Pre-divide while copying (PyTorch's mul by the reciprocal); a hook gets plain gradients.
      if (!comm_hook_) {
        at::mul_out(view, grad, at::scalar_tensor(1.0 / world, grad.options().dtype(at::kDouble)));
      } else {
        view.copy_(grad);
      }
      if (options_.gradient_as_bucket_view()) grad = view;
    }
  }
  ready_[index] = true;
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_];
    if (comm_hook_) {
      GradBucket grad_bucket{next_bucket_, bucket.contents, bucket.views, bucket.parameters,
                             next_bucket_ + 1 == buckets_.size()};
      bucket.reduction = comm_hook_(grad_bucket);
    } else {
      bucket.reduction = start_presummed_allreduce(*pg_, bucket.contents);
    }
    ++next_bucket_;
  }
}

std::string Reducer::describe_missing() const {
  std::string list;
  int shown = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (ready_[i]) continue;
    if (shown++ == 8) {
      list += ", ...";
      break;
    }
    list += (list.empty() ? "" : ", ") + std::to_string(i) + " '" + names_[i] + "'";
  }
  return list;
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  at::NoGradGuard no_grad;
  finalize_queued_ = false;
  expect_hooks_ = false;
  awaiting_backward_ = false;
  if (next_bucket_ < buckets_.size()) {
    // Finish what was started, so the process group stays in step, then report.
    for (size_t b = 0; b < next_bucket_; ++b) {
      try {
        buckets_[b].reduction->wait();
      } catch (...) {
      }
    }
    const std::string missing = describe_missing();
    reset_iteration();
    throw Error("DDP: these parameters received no gradient in this backward: " + missing +
                ". They took no part in computing the loss: construct DDP with "
                "find_unused_parameters(true), or static_graph(true) if the same ones are unused every iteration");
  }
  for (auto& bucket : buckets_) {
    at::Tensor result = bucket.reduction->wait();
    if (!result.is_same(bucket.contents)) bucket.contents.copy_(result);
    bucket.reduction.reset();
  }
  // A parameter unused on every rank keeps its gradient untouched (undefined stays undefined).
  // The condition is the same on every rank (options and iteration count), never data-dependent.
  std::vector<bool> used_globally(parameters_.size(), true);
  if (options_.static_graph() && iteration_ > 0) {
    used_globally = static_used_globally_;
  } else if (options_.find_unused_parameters() || options_.static_graph()) {
    at::Tensor map = at::empty({static_cast<int64_t>(parameters_.size())}, at::kInt);
    for (size_t i = 0; i < parameters_.size(); ++i) map[static_cast<int64_t>(i)] = static_cast<int>(used_locally_[i]);
    pg_->all_reduce(map, comm::ReduceOp::Sum);
    auto* used = map.data_ptr<int>();
    for (size_t i = 0; i < parameters_.size(); ++i) used_globally[i] = used[i] > 0;
    if (options_.static_graph()) static_used_globally_ = used_globally;
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!used_globally[i]) continue;
    auto [b, slot] = locator_[i];
    const at::Tensor& view = buckets_[b].views[slot];
    at::Tensor& grad = parameters_[i].mutable_grad();
    if (options_.gradient_as_bucket_view()) {
      if (!grad.defined() || !grad.is_alias_of(view)) grad = view;
    } else if (grad.defined()) {
      grad.copy_(view);
    } else {
      grad = view.clone();
    }
  }
  const bool rebuild_allowed = !options_.find_unused_parameters() || options_.static_graph();
  if (rebuild_allowed && iteration_ == 0) rebuild_pending_ = true;  // once: after the first iteration
  reset_iteration();
  ++iteration_;
}

void Reducer::reset_iteration() {
  next_bucket_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(used_locally_.begin(), used_locally_.end(), 0);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.parameters.size();
    bucket.reduction.reset();
  }
}

}  // namespace tandem::ddp
