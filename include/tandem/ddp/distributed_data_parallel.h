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
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tandem/comm/process_group.h"
#include "tandem/ddp/comm_hook.h"
#include "tandem/ddp/options.h"
#include "tandem/ddp/reducer.h"

namespace tandem::ddp {
namespace detail {

/// The part of DDP that does not depend on the wrapped module's type.
class DdpCore {
 public:
  DdpCore(torch::nn::Module& module, std::shared_ptr<comm::ProcessGroup> pg, DistributedDataParallelOptions options);

  /// Returns whether this forward takes part in gradient synchronisation.
  bool pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);

  bool sync_enabled() const { return sync_; }
  void set_sync(bool enabled) { sync_ = enabled; }
  Reducer& reducer() { return *reducer_; }
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return pg_; }

 private:
  std::shared_ptr<comm::ProcessGroup> pg_;
  DistributedDataParallelOptions options_;
  std::vector<at::Tensor> buffers_;
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
};

inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collect_tensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& tuple, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... parts) { (collect_tensors(parts, out), ...); }, tuple);
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& pair, std::vector<at::Tensor>& out) {
  collect_tensors(pair.first, out);
  collect_tensors(pair.second, out);
}
/// Outputs without tensors (or of a type we do not know) give find_unused nothing to start from.
template <typename T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}

}  // namespace detail

/// While alive, forwards and backwards of `ddp` accumulate gradients locally, without
/// communication (PyTorch's no_sync()). The forward decides: a forward inside the scope is never
/// synced, even if its backward runs after the scope ends.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(detail::DdpCore& core) : core_(core), previous_(core.sync_enabled()) { core.set_sync(false); }
  ~NoSyncGuard() { core_.set_sync(previous_); }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  detail::DdpCore& core_;
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
      detail::collect_tensors(output, tensors);
      core_->post_forward(tensors);
    }
    return output;
  }

  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*core_); }
  void register_comm_hook(CommHook hook) { core_->reducer().register_comm_hook(std::move(hook)); }

  ModuleHolder& module() { return module_; }
  detail::DdpCore* core() { return core_.get(); }
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
