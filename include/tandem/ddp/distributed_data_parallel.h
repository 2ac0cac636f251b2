#pragma once
// DistributedDataParallel: wraps any torch::nn::Module so that backward() leaves every rank with
// the average of all ranks' gradients (docs/guide-ddp.md).
//
// Example:
//   auto world = tandem::comm::World::from_env();
//   auto pg = tandem::comm::ProcessGroup::create(world);
//   Net net;  // a TORCH_MODULE holder
//   tandem::ddp::DistributedDataParallel ddp(net, pg,
//       tandem::ddp::DistributedDataParallelOptions().gradient_as_bucket_view(true));
//   torch::optim::SGD opt(ddp->parameters(), 0.1);
//   auto loss = torch::nll_loss(ddp->forward(x), y);
//   loss.backward();   // gradients are averaged across ranks while backward runs
//   opt.step();
//   { auto guard = ddp->no_sync(); ddp->forward(x2).sum().backward(); }  // local accumulation
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <type_traits>
#include <vector>

#include <torch/nn/module.h>
#include <c10/util/Type.h>
#include <torch/nn/pimpl.h>

#include "tandem/comm/process_group.h"
#include "tandem/ddp/comm_hook.h"
#include "tandem/ddp/options.h"
#include "tandem/ddp/reducer.h"
#include "tandem/output_tensors.h"

namespace tandem::ddp {
namespace detail {

/// The part of DDP that does not depend on the wrapped module's type.
class DdpCore {
 public:
  DdpCore(torch::nn::Module& module, std::shared_ptr<comm::ProcessGroup> pg, DistributedDataParallelOptions options);

  /// Returns whether this forward takes part in gradient synchronisation.
  bool pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs, bool outputs_complete, const std::string& output_type);

  /// Arms gradient synchronisation for the next backward, as a synced forward with `outputs`
  /// would (forwards run under no_sync, then one backward syncs what they accumulated).
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);
  bool sync_enabled() const { return sync_; }
  void set_sync(bool enabled) { sync_ = enabled; }
  Reducer& reducer() { return *reducer_; }
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return pg_; }

  /// Note [Join] (join.cpp): runs `body` with uneven inputs allowed, then stands in for this
  /// rank in the others' iterations until every rank is done. Returns the iterations shadowed.
  int64_t join(const std::function<void()>& body);

 private:
  void announce_active();              // in join mode: before every training forward
  /// Both sides of join: the counts of active and syncing ranks, and the highest active rank.
  struct JoinCounts {
    int64_t active = 0, syncing = 0;
    int highest_active = -1;
  };
  JoinCounts exchange_join_counts(bool active);
  int64_t shadow_until_all_joined();
  void sync_final_model(bool last_to_join);

  std::shared_ptr<comm::ProcessGroup> pg_;
  DistributedDataParallelOptions options_;
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> state_;      // every parameter and buffer, for join's final sync
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
  bool joining_ = false;
  int buffer_source_ = 0;              // rank 0, or in join mode the highest rank still training
};

}  // namespace detail

/// While alive, forwards and backwards of a DDP module accumulate gradients locally, without
/// communication (PyTorch's no_sync()). The forward decides: a forward inside the scope is never
/// synced, even if its backward runs after the scope ends.
class NoSyncGuard {
 public:
  ~NoSyncGuard() {
    if (core_) core_->set_sync(previous_);
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept : core_(std::exchange(other.core_, nullptr)), previous_(other.previous_) {}
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  template <typename>
  friend class DistributedDataParallelImpl;
  explicit NoSyncGuard(detail::DdpCore& core) : core_(&core), previous_(core.sync_enabled()) { core.set_sync(false); }
  detail::DdpCore* core_;
  bool previous_;
};

template <typename ModuleHolder>
class DistributedDataParallelImpl : public torch::nn::Module {
 public:
  DistributedDataParallelImpl(ModuleHolder module, std::shared_ptr<comm::ProcessGroup> pg,
                              DistributedDataParallelOptions options = {})
      : torch::nn::Module("DistributedDataParallel"), module_(register_module("module", module)) {
    core_ = std::make_unique<detail::DdpCore>(*this, std::move(pg), options);
  }

  /// Calls the wrapped module's forward, around the synchronisation DDP needs.
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    const bool synced = core_->pre_forward();
    auto output = module_->forward(std::forward<Args>(args)...);
    if (synced) {
      std::vector<at::Tensor> tensors;
      const bool complete = tandem::detail::OutputTensors<decltype(output)>::collect(output, tensors);
      core_->post_forward(tensors, complete, c10::demangle_type<decltype(output)>());
    }
    return output;
  }

  /// Local accumulation while the returned guard lives (PyTorch's `with ddp.no_sync():`).
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*core_); }
  /// Whether the next forwards take part in gradient synchronisation (PyTorch's
  /// require_backward_grad_sync); no_sync() sets it to false for its scope.
  void set_require_backward_grad_sync(bool enabled) { core_->set_sync(enabled); }
  bool require_backward_grad_sync() const { return core_->sync_enabled(); }
  /// Arms the next backward to synchronise every gradient accumulated so far, as if the forward
  /// that produced `outputs` had been synced (PyTorch's reducer.prepare_for_backward, which its
  /// pipeline stages call before their last backward of a step). For several forwards in flight:
  /// run them all with set_require_backward_grad_sync(false), then call this with the output of
  /// the forward whose backward runs last; that backward all-reduces the sum of all of them.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs) { core_->prepare_for_backward(outputs); }
  /// Registers the reduction of each bucket (comm_hook.h); before the first forward.
  void register_comm_hook(CommHook hook) { core_->reducer().register_comm_hook(std::move(hook)); }

  /// Uneven inputs (PyTorch's `with Join([ddp]):`): runs `body`, the training loop over this
  /// rank's data, however many batches each rank has. A rank whose loop ends first stands in
  /// for itself in the others' gradient all-reduces (contributing zeros; gradients are still
  /// divided by the world size) until every rank's loop has ended; then every rank holds the
  /// weights of a rank that trained to the end. Returns how many iterations this rank stood in
  /// for. Each synced training forward inside `body` must be followed by its backward. Rethrows
  /// what `body` throws, without waiting for the others (they then fail naming this rank).
  /// Inside `body` only this module's collectives may run: a GradScaler's found-inf all-reduce,
  /// an Accelerator gather/reduce/wait_for_everyone or a checkpoint save would meet the joined
  /// ranks' join counts instead of their own partners (PyTorch needs a Joinable per component
  /// for the same reason).
  ///
  /// Example:
  ///   ddp->join([&] {
  ///     for (auto& batch : my_uneven_batches) { opt.zero_grad(); loss(ddp->forward(batch.x)).backward(); opt.step(); }
  ///   });
  int64_t join(const std::function<void()>& body) { return core_->join(body); }

  /// The wrapped module, with its own type (PyTorch's ddp.module).
  ModuleHolder& module() { return module_; }
  Reducer& reducer() { return core_->reducer(); }
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return core_->process_group(); }

 private:
  ModuleHolder module_;
  std::unique_ptr<detail::DdpCore> core_;
};

/// A module holder, like those TORCH_MODULE declares: `ddp->forward(x)`, `ddp->parameters()`.
template <typename ModuleHolder>
class DistributedDataParallel : public torch::nn::ModuleHolder<DistributedDataParallelImpl<ModuleHolder>> {
 public:
  using torch::nn::ModuleHolder<DistributedDataParallelImpl<ModuleHolder>>::ModuleHolder;
};

template <typename ModuleHolder, typename... Rest>
DistributedDataParallel(ModuleHolder, Rest...) -> DistributedDataParallel<ModuleHolder>;

}  // namespace tandem::ddp
