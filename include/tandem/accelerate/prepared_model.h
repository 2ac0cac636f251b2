#pragma once
// PreparedModel: the user's module, wrapped for the strategy the Accelerator chose, with its type
// kept: `model->forward(x)` calls the user's forward (through DDP or DataParallel, under autocast
// when mixed precision is on), `model->module()` is the user's holder.
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tandem/accelerate/options.h"
#include "tandem/amp/autocast.h"
#include "tandem/error.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/dp/data_parallel.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"

namespace tandem {

template <typename ModuleHolder>
class PreparedModelImpl : public torch::nn::Module {
 public:
  using Ddp = ddp::DistributedDataParallel<ModuleHolder>;
  using Dp = dp::DataParallel<ModuleHolder>;
  using Fsdp = fsdp::FullyShardedDataParallel<ModuleHolder>;

  /// Autocast of forward: the device type and dtype, when mixed precision is on.
  struct Autocast {
    c10::DeviceType device_type = c10::DeviceType::CPU;
    at::ScalarType dtype = at::kBFloat16;
  };

  PreparedModelImpl(ModuleHolder module, std::optional<Ddp> ddp, std::optional<Dp> dp, std::optional<Fsdp> fsdp,
                    std::optional<Autocast> autocast)
      : torch::nn::Module("PreparedModel"), module_(std::move(module)), autocast_(autocast) {
    if (ddp) {
      ddp_ = register_module("wrapper", *ddp);
    } else if (fsdp) {
      fsdp_ = register_module("wrapper", *fsdp);
    } else if (dp) {
      dp_ = register_module("wrapper", *dp);
    } else {
      register_module("module", module_);
    }
  }

  /// The user's forward, through the strategy's wrapper.
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    std::optional<amp::AutocastScope> scope;
    if (autocast_) scope.emplace(autocast_->device_type, autocast_->dtype);
    if (ddp_) return (*ddp_)->forward(std::forward<Args>(args)...);
    if (fsdp_) return (*fsdp_)->forward(std::forward<Args>(args)...);
    if (dp_) {
      if constexpr (sizeof...(Args) == 1 && (std::is_convertible_v<Args, const at::Tensor&> && ...) &&
                    std::is_same_v<decltype(module_->forward(std::forward<Args>(args)...)), at::Tensor>) {
        return (*dp_)->forward(std::forward<Args>(args)...);
      } else {
        throw Error("Accelerator: the DataParallel strategy needs a module whose forward takes and returns one tensor");
      }
    }
    return module_->forward(std::forward<Args>(args)...);
  }

  /// The user's module (PyTorch's accelerator.unwrap_model).
  ModuleHolder& module() { return module_; }
  /// Whether the next forwards take part in gradient synchronisation (DDP and FSDP).
  void set_require_backward_grad_sync(bool enabled) {
    if (ddp_) (*ddp_)->set_require_backward_grad_sync(enabled);
    if (fsdp_) (*fsdp_)->set_requires_gradient_sync(enabled);
  }
  /// Arms the next backward to synchronise the gradients accumulated so far (DDP's and FSDP's
  /// prepare_for_backward: several forwards in flight, one synchronised backward; a pipeline
  /// stage's last). Nothing without a data-parallel wrapper.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs) {
    if (ddp_) (*ddp_)->prepare_for_backward(outputs);
    if (fsdp_) (*fsdp_)->prepare_for_backward();
  }
  bool synchronises() const { return ddp_ || fsdp_; }
  /// Uneven inputs (accelerate's join_uneven_inputs): the ranks may run `body` over different
  /// numbers of batches. Under DDP this is DistributedDataParallel::join (Note [Join] in
  /// src/ddp/join.cpp): a rank out of data stands in with zero gradients until all are done, then
  /// all hold the same weights; returns the iterations this rank stood in for. Other strategies
  /// have one process: `body` just runs. prepare_data's loaders never need it (every rank gets the
  /// same number of batches, padded or dropped); data split by hand may.
  int64_t join_uneven_inputs(const std::function<void()>& body) {
    if (ddp_) return (*ddp_)->join(body);
    TANDEM_CHECK(!fsdp_, "join_uneven_inputs: not available under Strategy::Fsdp (a rank out of data cannot stand in "
                         "for its units' gathers); give every rank the same number of batches (prepare_data does)");
    body();
    return 0;
  }
  bool is_ddp() const { return ddp_.has_value(); }
  bool is_fsdp() const { return fsdp_.has_value(); }
  /// The FSDP wrapper under Strategy::Fsdp (memory(), units(), gather_parameters()).
  Fsdp& fsdp() {
    TANDEM_CHECK(fsdp_, "PreparedModel: not prepared under Strategy::Fsdp");
    return *fsdp_;
  }
  bool is_data_parallel() const { return dp_.has_value(); }

 private:
  ModuleHolder module_;
  std::optional<Ddp> ddp_;
  std::optional<Dp> dp_;
  std::optional<Fsdp> fsdp_;
  std::optional<Autocast> autocast_;
};

/// A module holder over PreparedModelImpl: `model->forward(x)`, `model->parameters()`.
template <typename ModuleHolder>
class PreparedModel : public torch::nn::ModuleHolder<PreparedModelImpl<ModuleHolder>> {
 public:
  using torch::nn::ModuleHolder<PreparedModelImpl<ModuleHolder>>::ModuleHolder;
};

}  // namespace tandem
