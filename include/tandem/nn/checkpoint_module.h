#pragma once
// tandem::nn::Checkpoint: a module whose forward is one checkpointed segment (checkpoint.h), as
// PyTorch's checkpoint_wrapper. Like tandem::fsdp::Unit it adopts the wrapped module's parameters,
// buffers and children under their own names, so parameter names (and checkpoints) do not change.
//
//   blocks->push_back(tandem::nn::Checkpoint(Block(...)));   // or checkpoint_modules (checkpoint_policy.h)
//   x = blocks->forward(x);                                   // Block's forward, recomputed in backward
//   y = wrapped->call<at::Tensor>(x, mask);                   // any arguments
#include <memory>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include "tandem/nn/checkpoint.h"
#include "tandem/nn/wrapper.h"

namespace tandem::nn {

/// A module that checkpoints its own forward when asked (tandem::fsdp::Unit): checkpoint_modules
/// sets its flag rather than wrapping it in a Checkpoint, so that what it does around the wrapped
/// forward (FSDP's gathers) stays outside the recompute.
class Checkpointable {
 public:
  virtual ~Checkpointable() = default;
  virtual void set_activation_checkpointing(bool on, const CheckpointOptions& options = {}) = 0;
  virtual bool activation_checkpointing() const = 0;
  /// Module::name() of what it wraps: the type checkpoint policies match.
  virtual std::string wrapped_name() const = 0;
};

class CheckpointImpl : public Wrapper {
 public:
  /// Wraps `module` (any module with a forward); `options.parameters()` is ignored: the segment's
  /// parameters are the module's.
  explicit CheckpointImpl(torch::nn::AnyModule module, CheckpointOptions options = {});
  template <typename M>
  explicit CheckpointImpl(torch::nn::ModuleHolder<M> module, CheckpointOptions options = {})
      : CheckpointImpl(torch::nn::AnyModule(std::move(module)), std::move(options)) {}
  template <typename M>
  explicit CheckpointImpl(std::shared_ptr<M> module, CheckpointOptions options = {})
      : CheckpointImpl(torch::nn::AnyModule(std::move(module)), std::move(options)) {}

  /// The wrapped module's forward on one tensor (what torch::nn::Sequential calls).
  at::Tensor forward(at::Tensor input) { return call<at::Tensor>(std::move(input)); }
  /// The wrapped module's forward with any arguments, returning `R`, checkpointed.
  template <typename R = at::Tensor, typename... Args>
  R call(Args&&... args) {
    torch::nn::AnyModule inner = inner_;
    auto run = [inner](auto&&... a) mutable { return inner.forward<R>(std::forward<decltype(a)>(a)...); };
    return nn::checkpoint(CheckpointOptions(options_).parameters(parameters()), run, std::forward<Args>(args)...);
  }

 private:
  CheckpointOptions options_;
};
TORCH_MODULE(Checkpoint);

}  // namespace tandem::nn
