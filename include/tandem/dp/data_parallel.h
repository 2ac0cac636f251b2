#pragma once
// DataParallel: one process drives several devices (docs/guide-dp.md).
//
// Each forward splits the batch along dim 0 into at most one chunk per device (at::chunk, as
// PyTorch's scatter: a batch of 5 on 3 devices is 2+2+1, a batch of 2 uses 2 devices), runs the
// replicas in parallel threads, and concatenates the outputs on the output device. After
// backward, the primary module's gradients are the sum over chunks — what one device would have
// computed on the whole batch. On GPUs each replica thread runs with its device current and the
// caller's current stream of it, and every copy is ordered on those streams (Note [DataParallel
// streams] in src/dp/data_parallel.cpp).
//
// Note [DataParallel buffers] (both modes)
// The primary module is replica 0 itself: its parameters and buffers are used in place. Every
// other replica starts each forward with the primary's buffers; what they write into their
// buffers (e.g. BatchNorm running statistics from their chunk) is discarded. So running
// statistics advance on chunk 0 only — PyTorch's DataParallel guarantee ("the replica on
// device[0] shares storage with the module").
//
// Example:
//   Net net;
//   tandem::dp::DataParallel model(net, tandem::dp::DataParallelOptions()
//                                           .devices({torch::Device("cuda:0"), torch::Device("cuda:1")}));
//   torch::optim::SGD opt(model->parameters(), 0.1);
//   auto loss = torch::nll_loss(model->forward(x), y);
//   loss.backward();
//   opt.step();
#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tandem/dp/memory.h"
#include "tandem/dp/options.h"

namespace torch::autograd {
struct Node;
}

namespace tandem {
class CpuMemoryTracker;
}

namespace tandem::dp {
namespace detail {

/// The part that does not depend on the wrapped module's type.
class DpCore {
 public:
  using Forward = std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)>;
  using Factory = std::function<std::shared_ptr<torch::nn::Module>()>;

  DpCore(std::shared_ptr<torch::nn::Module> primary, DataParallelOptions options, Forward forward,
         Factory factory);
  ~DpCore();

  at::Tensor forward(const at::Tensor& input);

  const DataParallelOptions& options() const { return options_; }
  /// The kept replicas (see DataParallelImpl::replicas).
  const std::vector<std::shared_ptr<torch::nn::Module>>& replicas() const { return replicas_; }
  MemoryReport memory_report() const;
  void reset_memory_peaks();

 private:
  std::shared_ptr<torch::nn::Module> make_replica(const c10::Device& device) const;
  void sync_persistent_replicas();
  void arm_gradient_reduction();
  void reduce_gradients();

  std::shared_ptr<torch::nn::Module> primary_;
  DataParallelOptions options_;
  Forward forward_;
  Factory factory_;
  std::vector<std::shared_ptr<torch::nn::Module>> replicas_;
  // Persistent mode: hooks on the replicas' gradient accumulators. They fire on the autograd
  // engine's threads (one per device), hence atomics.
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  std::atomic<bool> reduction_armed_{false};
  std::atomic<bool> reduction_queued_{false};
  std::unique_ptr<CpuMemoryTracker> memory_;  // only with track_cpu_memory
  size_t last_used_ = 0;  // replicas that took part in the last forward
};

}  // namespace detail

template <typename ModuleHolder>
class DataParallelImpl : public torch::nn::Module {
 public:
  /// `make_replica` builds a fresh module of the same architecture; needed only when the module
  /// is not a torch::nn::Cloneable (the built-in LibTorch modules are).
  DataParallelImpl(ModuleHolder module, DataParallelOptions options = {},
                   std::function<ModuleHolder()> make_replica = nullptr)
      : torch::nn::Module("DataParallel"), module_(register_module("module", module)) {
    detail::DpCore::Factory factory;
    if (make_replica) factory = [make_replica] { return std::static_pointer_cast<torch::nn::Module>(make_replica().ptr()); };
    core_ = std::make_unique<detail::DpCore>(
        module_.ptr(), std::move(options),
        [](torch::nn::Module& m, const at::Tensor& x) -> at::Tensor {
          return static_cast<typename ModuleHolder::ContainedType&>(m).forward(x);
        },
        std::move(factory));
  }

  at::Tensor forward(const at::Tensor& input) { return core_->forward(input); }

  /// The primary module, with its own type (PyTorch's dp.module).
  ModuleHolder& module() { return module_; }
  /// The kept replicas, replica 0 being the primary: every device's in Persistent mode; the
  /// primary alone in Replicate mode (its copies live only through a forward and its backward).
  const std::vector<std::shared_ptr<torch::nn::Module>>& replicas() const { return core_->replicas(); }
  /// Per-device bytes: parameters, gradients, activations, optimizer state (docs/guide-dp.md).
  MemoryReport memory_report() const { return core_->memory_report(); }
  /// Starts the activation peaks afresh (CPU: tracked bytes; CUDA: the allocator's peak).
  void reset_memory_peaks() { core_->reset_memory_peaks(); }

 private:
  ModuleHolder module_;
  std::unique_ptr<detail::DpCore> core_;
};

template <typename ModuleHolder>
class DataParallel : public torch::nn::ModuleHolder<DataParallelImpl<ModuleHolder>> {
 public:
  using torch::nn::ModuleHolder<DataParallelImpl<ModuleHolder>>::ModuleHolder;
};

template <typename ModuleHolder, typename... Rest>
DataParallel(ModuleHolder, Rest...) -> DataParallel<ModuleHolder>;

}  // namespace tandem::dp
