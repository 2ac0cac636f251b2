#include "tandem/ddp/reducer.h"

#include <algorithm>
#include <unordered_set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include "common/ready_hook.h"
#include "common/storage_alias.h"
#include "common/scope_exit.h"
#include "ddp/all_reduce_buckets.h"
#include "tandem/ddp/failed_backward.h"
#include "tandem/error.h"

namespace tandem::ddp {

// Autograd nodes (the outputs' pre-hooks) may outlive the reducer: they reach it through this.
struct Reducer::Anchor {
  std::mutex mutex;
  Reducer* reducer = nullptr;
};

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

// The end-of-backward callback's token: run, it finalizes the iteration; destroyed unrun (the
// engine drops its callbacks when backward raises), it tells the reducer (Note [Failed backward]).
// It reaches the reducer through the anchor: the engine may destroy it late, on another thread,
// after the DDP module is gone.
template <typename Anchor>
class BackwardEnd {
 public:
  explicit BackwardEnd(std::weak_ptr<Anchor> anchor) : anchor_(std::move(anchor)) {}
  ~BackwardEnd() {
    if (ran_) return;
    if (auto anchor = anchor_.lock()) {
      std::lock_guard<std::mutex> hold(anchor->mutex);
      if (anchor->reducer) anchor->reducer->on_backward_abandoned();
    }
  }
  BackwardEnd(const BackwardEnd&) = delete;
  BackwardEnd& operator=(const BackwardEnd&) = delete;
  void run() {
    ran_ = true;
    if (auto anchor = anchor_.lock()) {
      Reducer* reducer = nullptr;
      {
        std::lock_guard<std::mutex> hold(anchor->mutex);
        reducer = anchor->reducer;
      }
      if (reducer) reducer->on_backward_finished();  // the module is alive: backward() is running
    }
  }

 private:
  std::weak_ptr<Anchor> anchor_;
  bool ran_ = false;
};

// Runs when backward reaches a synced forward's output, before any gradient of the model exists:
// from there on a failure of backward is one the reducer must recover from.
class OutputReached : public torch::autograd::FunctionPreHook {
 public:
  OutputReached(std::weak_ptr<void> anchor, std::function<void()> fn) : anchor_(std::move(anchor)), fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (auto alive = anchor_.lock()) fn_();
    return grads;
  }

 private:
  std::weak_ptr<void> anchor_;
  std::function<void()> fn_;
};

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                 std::shared_ptr<comm::ProcessGroup> pg, DistributedDataParallelOptions options)
    : parameters_(std::move(parameters)), names_(std::move(names)), pg_(std::move(pg)), options_(options),
      reduction_(std::make_unique<detail::AllReduceBuckets>(pg_, options_, parameters_.size())),
      anchor_(std::make_shared<Anchor>()), instance_(pg_->count_object("ddp reducer")) {
  TANDEM_CHECK(!parameters_.empty(), "DDP: the module has no parameter that requires a gradient");
  for (size_t i = 0; i < parameters_.size(); ++i) {
    TANDEM_CHECK(parameters_[i].is_contiguous(), "DDP: parameter ", i, " ('", names_[i], "') is not contiguous");
  }
  anchor_->reducer = this;
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
    hook_keys_.push_back(accumulator->add_post_hook(
        std::make_unique<tandem::detail::ReadyHook>([this, i] { on_gradient_ready(i); })));
    grad_accumulators_.push_back(std::move(accumulator));
  }
}

Reducer::~Reducer() {
  {
    std::lock_guard<std::mutex> hold(anchor_->mutex);
    anchor_->reducer = nullptr;
  }
  for (size_t i = 0; i < grad_accumulators_.size(); ++i) grad_accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::build_buckets(const BucketAssignment& assignment) {
  std::vector<Bucket> buckets(assignment.buckets.size());
  locator_.assign(parameters_.size(), {0, 0});
  for (size_t b = 0; b < assignment.buckets.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.size_limit = assignment.size_limits[b];
    for (auto index : assignment.buckets[b]) {
      const auto i = static_cast<size_t>(index);
      locator_[i] = {b, bucket.parameters.size()};
      bucket.parameters.push_back(i);
      bucket.numel += parameters_[i].numel();
    }
    bucket.padded = reduction_->buffer_numel(bucket.numel);
    bucket.pending = bucket.parameters.size();
  }
  buckets_ = std::move(buckets);
  ++bucket_builds_;
  if (configured_ && !passthrough_) allocate_buckets();
}

void Reducer::allocate_buckets() {
  if (!reduction_->keeps_buffers()) return;  // a bucket exists only while it is reduced
  at::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    allocate_contents(bucket);
    for (size_t slot = 0; slot < bucket.parameters.size(); ++slot) {
      auto& param = parameters_[bucket.parameters[slot]];
      if (options_.gradient_as_bucket_view() && param.grad().defined()) {
        bucket.views[slot].copy_(param.grad());
        param.mutable_grad() = bucket.views[slot];
      }
    }
  }
}

void Reducer::allocate_contents(Bucket& bucket) {
  at::NoGradGuard no_grad;
  // Zeroed: the padding, and what a backward that fails half-way still reduces (Note [Failed backward]).
  bucket.contents = at::zeros({bucket.padded}, parameters_[bucket.parameters.front()].options().requires_grad(false));
  bucket.views.clear();
  int64_t offset = 0;
  for (auto i : bucket.parameters) {
    auto& param = parameters_[i];
    bucket.views.push_back(tandem::detail::storage_alias(bucket.contents, offset, param.sizes()));
    offset += param.numel();
  }
}

void Reducer::set_bucket_reduction(std::unique_ptr<BucketReduction> reduction, const BucketAssignment& assignment) {
  std::lock_guard<std::mutex> lock(mutex_);
  reduction->check(*this);
  std::vector<int> seen(parameters_.size(), 0);
  for (const auto& bucket : assignment.buckets) {
    TANDEM_CHECK(!bucket.empty(), "DDP: set_bucket_reduction: an empty bucket");
    const auto& first = parameters_.at(static_cast<size_t>(bucket.front()));
    for (auto index : bucket) {
      const auto i = static_cast<size_t>(index);
      TANDEM_CHECK(index >= 0 && i < parameters_.size() && seen[i]++ == 0, "DDP: set_bucket_reduction: parameter ",
                   index, " is out of range or in two buckets");
      TANDEM_CHECK(parameters_[i].scalar_type() == first.scalar_type() && parameters_[i].device() == first.device(),
                   "DDP: set_bucket_reduction: a bucket mixes dtypes or devices");
    }
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    TANDEM_CHECK(seen[i] == 1, "DDP: set_bucket_reduction: parameter ", i, " ('", names_[i], "') is in no bucket");
  }
  reduction_ = std::move(reduction);
  assignment_given_ = true;
  build_buckets(assignment);
}

void Reducer::register_comm_hook(CommHook hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  reduction_->register_comm_hook(*this, std::move(hook));
}

void Reducer::prepare_for_forward(bool synced) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!configured_) {
    // Note [World of one]: decided once, at the first forward, when the hook is known.
    configured_ = true;
    passthrough_ = pg_->size() == 1 && reduction_->passes_through_alone();
    if (!passthrough_) allocate_buckets();
  }
  if (awaiting_backward_ && !backward_failed_) {
    reset_iteration();  // the error is raised once; the next forward starts afresh
    TANDEM_CHECK(false,
                 "DDP: forward() was called again before the last synced forward's backward() started: call "
                 "backward() once per synced forward(), or run extra forwards under at::NoGradGuard or inside "
                 "no_sync()");
  }
  if (awaiting_backward_) finish_failed_iteration();
  if (!synced || !rebuild_pending_) return;
  // Rank 0's arrival order, so every rank builds the same buckets. Parameters that never arrived
  // (unused) go last, in reverse registration order.
  std::vector<int64_t> order = arrival_order_;
  std::vector<bool> arrived(parameters_.size(), false);
  for (auto i : order) arrived[static_cast<size_t>(i)] = true;
  for (size_t i = parameters_.size(); i-- > 0;) {
    if (!arrived[i]) order.push_back(static_cast<int64_t>(i));
  }
  if (pg_->size() > 1) {
    at::Tensor shared = at::tensor(order, at::kLong);
    pg_->broadcast(shared, 0);
    order.assign(shared.data_ptr<int64_t>(), shared.data_ptr<int64_t>() + shared.numel());
  }
  build_buckets(compute_bucket_assignment(specs_of(parameters_), bucket_size_limits(options_), order));
  reset_iteration();
  rebuild_pending_ = false;
  arrival_order_.clear();  // recorded in the first iteration only; not needed again
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs, bool outputs_complete,
                                   const std::string& output_type) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool search = options_.find_unused_parameters() || (options_.static_graph() && !unused_known_);
  TANDEM_CHECK(!search || outputs_complete, "DDP: ",
               options_.find_unused_parameters() ? "find_unused_parameters" : "static_graph",
               " needs every tensor of forward()'s output, but DDP cannot look inside a value of type '",
               output_type,
               "': return a tensor, or a std::vector, std::tuple, std::pair or std::optional of them");
  // An output that nothing can flow back through (a frozen model, argmax) arms nothing.
  const bool differentiable = !outputs_complete || std::any_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) {
    return t.defined() && t.requires_grad();
  });
  if (!differentiable) return;
  expect_hooks_ = true;
  awaiting_backward_ = true;
  // Backward reaching any output means it started for this iteration (Note [Failed backward]).
  const std::weak_ptr<void> anchor = anchor_;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    if (auto fn = out.grad_fn()) {
      fn->add_pre_hook(std::make_unique<OutputReached>(anchor, [anchor = anchor_.get()] {
        std::lock_guard<std::mutex> hold(anchor->mutex);
        if (anchor->reducer) anchor->reducer->on_backward_started();
      }));
    }
  }
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

void Reducer::on_backward_started() {
  std::lock_guard<std::mutex> lock(mutex_);
  start_backward_locked();
}

void Reducer::start_backward_locked() {
  if (!expect_hooks_ || backward_started_) return;
  backward_started_ = true;
  // Queued first: if a launch below throws, the dropped token still marks the iteration failed.
  auto token = std::make_shared<BackwardEnd<Anchor>>(std::weak_ptr<Anchor>(anchor_));
  torch::autograd::Engine::get_default_engine().queue_callback([token] { token->run(); });
  // Parameters this forward did not reach are ready now: their buckets must launch even when
  // no gradient of this rank arrives at all.
  for (auto unused : unused_) {
    if (!ready_[unused]) mark_ready(unused, /*produced=*/false);
  }
}

// No lock: the engine may drop the token on any thread, at any point of its unwinding.
void Reducer::on_backward_abandoned() { backward_failed_ = true; }

void Reducer::on_gradient_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!expect_hooks_) return;  // no_sync, or a backward not started from a synced forward
  start_backward_locked();
  TANDEM_CHECK(!ready_[index], "DDP: parameter ", index, " ('", names_[index],
               "') received a second gradient in one backward; DDP reduces each gradient once per iteration");
  if (iteration_ == 0) arrival_order_.push_back(static_cast<int64_t>(index));
  mark_ready(index, /*produced=*/true);
}

void Reducer::mark_ready(size_t index, bool produced) {
  auto [b, slot] = locator_[index];
  Bucket& bucket = buckets_[b];
  if (produced) used_locally_[index] = 1;
  ready_[index] = true;
  if (!passthrough_) {
    at::NoGradGuard no_grad;
    if (!bucket.contents.defined()) allocate_contents(bucket);  // its first gradient in this backward
    reduction_->fill(index, parameters_[index].mutable_grad(), bucket.views[slot], produced);
  }
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(next_bucket_);
    ++next_bucket_;
  }
}

void Reducer::launch(size_t b) {
  if (passthrough_) return;
  Bucket& bucket = buckets_[b];
  if (!bucket.contents.defined()) allocate_contents(bucket);  // a failed backward reached none of its parameters
  bucket.reduction = reduction_->launch(b, bucket, b + 1 == buckets_.size());
}

// Waits for buckets 0..count-1 whatever happens; returns the first failure's message.
std::string Reducer::wait_launched(size_t count) {
  std::string first_error;
  for (size_t b = 0; b < count && b < buckets_.size(); ++b) {
    if (!buckets_[b].reduction) continue;
    try {
      buckets_[b].reduction->wait();
    } catch (const std::exception& e) {
      if (first_error.empty()) first_error = one_line(e);
    }
  }
  return first_error;
}

// Note [Failed backward]: every rank posts how many buckets it launched; the largest count wins.
size_t Reducer::agree_on_launched(size_t launched) {
  const std::string prefix = "tandem/ddp/" + std::to_string(instance_) + "/failed/" + std::to_string(failed_iterations_) + "/";
  size_t target = launched;
  for (const auto& post : exchange_after_failed_backward(*pg_, prefix, std::to_string(launched), "DDP")) {
    target = std::max<size_t>(target, std::stoul(post));
  }
  return target;
}

void Reducer::finish_failed_iteration() {
  const size_t launched = next_bucket_;
  ScopeExit clean([this] {
    reset_iteration();
    arrival_order_.clear();  // the failed iteration does not count as the first
    ++failed_iterations_;
  });
  const size_t target = (pg_->size() > 1 && !passthrough_) ? agree_on_launched(launched) : launched;
  std::string error;
  for (size_t b = launched; b < target; ++b) {
    try {
      launch(b);  // partial contents: the partners need the collective, nobody needs the result
    } catch (const std::exception& e) {
      if (error.empty()) error = one_line(e);
    }
  }
  const std::string waited = wait_launched(target);
  if (error.empty()) error = waited;
  TANDEM_CHECK(error.empty(), "DDP: the previous backward failed, and finishing the gradient all-reduces it had "
                              "started failed too: ", error);
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

void Reducer::on_backward_finished() { finalize_backward(); }

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  at::NoGradGuard no_grad;
  ScopeExit clean([this] { reset_iteration(); });  // whatever happens below, the next iteration starts clean
  if (next_bucket_ < buckets_.size()) {
    // The missing gradients contribute zeros, so that every bucket is launched as on the ranks
    // that had them all (the collectives stay in step), then every one is waited for.
    const std::string missing = describe_missing();
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (!ready_[i]) mark_ready(i, /*produced=*/false);
    }
    const std::string comm_error = wait_launched(buckets_.size());
    // The ranks that had every gradient all-reduce the used map and count this iteration (they
    // may rebuild at the next forward, a broadcast): so does this one, or the collectives would
    // fall out of step.
    if (comm_error.empty()) (void)global_use();
    end_iteration_bookkeeping();
    throw Error("DDP: these parameters received no gradient in this backward: " + missing +
                ". They took no part in computing the loss: construct DDP with "
                "find_unused_parameters(true), or static_graph(true) if the same ones are unused every iteration" +
                (comm_error.empty() ? "" : "; finishing the all-reduces already started failed too: " + comm_error));
  }
  // Every bucket is waited for even when one fails: none may still be writing into its buffer
  // (a .grad with bucket views) when the next iteration starts.
  std::string failure;
  for (auto& bucket : buckets_) {
    if (!bucket.reduction) continue;
    try {
      reduction_->finish(bucket, bucket.reduction->wait());
    } catch (const std::exception& e) {
      if (failure.empty()) failure = one_line(e);
    }
  }
  TANDEM_CHECK(failure.empty(), failure);
  const std::vector<bool> used_globally = global_use();
  if (!passthrough_) reduction_->write_back(buckets_, parameters_, used_globally);
  end_iteration_bookkeeping();
}

void Reducer::shadow_iteration() {
  std::lock_guard<std::mutex> lock(mutex_);
  at::NoGradGuard no_grad;
  ScopeExit clean([this] { reset_iteration(); });
  TANDEM_CHECK(configured_ && !passthrough_, "DDP: shadow_iteration() needs a configured reducer in a world of several");
  for (auto& bucket : buckets_) {
    if (!bucket.contents.defined()) allocate_contents(bucket);
    bucket.contents.zero_();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].pending = 0;
    launch(b);
  }
  next_bucket_ = buckets_.size();
  const std::string failure = wait_launched(buckets_.size());
  TANDEM_CHECK(failure.empty(), failure);
  (void)global_use();  // nothing used here: all zeros, as the active ranks expect a map from everyone
  end_iteration_bookkeeping();
}

// A parameter unused on every rank keeps its gradient untouched (undefined stays undefined).
// The condition is the same on every rank (options and iteration count), never data-dependent,
// so the all-reduce of the used map happens everywhere or nowhere.
std::vector<bool> Reducer::global_use() {
  std::vector<bool> used_globally(parameters_.size(), true);
  if (options_.static_graph() && iteration_ > 0) {
    used_globally = static_used_globally_;
  } else if (options_.find_unused_parameters() || options_.static_graph()) {
    at::Tensor map = at::from_blob(used_locally_.data(), {static_cast<int64_t>(used_locally_.size())}, at::kInt).clone();
    if (pg_->size() > 1) pg_->all_reduce(map, comm::ReduceOp::Sum);
    const auto* used = map.data_ptr<int32_t>();
    for (size_t i = 0; i < parameters_.size(); ++i) used_globally[i] = used[i] > 0;
    if (options_.static_graph()) static_used_globally_ = used_globally;
  }
  return used_globally;
}

void Reducer::end_iteration_bookkeeping() {
  const bool rebuild_allowed = (!options_.find_unused_parameters() || options_.static_graph()) && !assignment_given_;
  if (rebuild_allowed && iteration_ == 0) rebuild_pending_ = true;  // once: after the first iteration
  ++iteration_;
}

void Reducer::reset_iteration() {
  expect_hooks_ = false;
  backward_started_ = false;
  backward_failed_ = false;
  awaiting_backward_ = false;
  next_bucket_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(used_locally_.begin(), used_locally_.end(), 0);
  reduction_->reset();
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.parameters.size();
    bucket.reduction.reset();
    if (!reduction_->keeps_buffers()) {  // the buffer goes once reduced
      bucket.contents.reset();
      bucket.views.clear();
    }
  }
}

}  // namespace tandem::ddp
