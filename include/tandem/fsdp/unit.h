#pragma once
// tandem::fsdp::Unit: marks a module as one sharding unit of FullyShardedDataParallel
// (docs/design/fsdp.md). LibTorch modules have no forward hooks, so the unit is a module in the
// tree that runs the wrapped module's forward between "gather my parameters" and "free them".
//
// The unit adopts the wrapped module's parameters, buffers and children under their own names
// (tandem/nn/wrapper.h), so a checkpoint written under DDP names the same tensors. Put units where the model's forward calls them through the tree:
//
//   auto blocks = torch::nn::Sequential(Block(...), Block(...));
//   tandem::fsdp::wrap_entries(*blocks);            // each entry becomes a Unit, in place
//   // or by hand, in a module of your own:
//   block1 = register_module("block1", tandem::fsdp::Unit(Block(...)));
//   x = block1->forward(x);                          // or block1->call<at::Tensor>(x, mask)
//
// Activation checkpointing (tandem/nn/checkpoint.h): block1->set_activation_checkpointing(true), or
// FullyShardOptions::activation_checkpointing. The unit gathers, then runs the wrapped forward as a
// checkpointed segment; the segment's backward (the recompute) runs once the engine has gathered the
// unit again for its backward (Note [Checkpointed units] in src/fsdp/engine.cpp).
//
// A module inside a unit must be called through the unit: its parameters are empty while the
// unit is at rest.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include "tandem/error.h"
#include "tandem/fsdp/forward_cast.h"
#include "tandem/nn/checkpoint.h"
#include "tandem/nn/checkpoint_module.h"
#include "tandem/nn/wrapper.h"
#include "tandem/output_tensors.h"

namespace tandem::fsdp {
namespace detail {

class Engine;
/// Called by units around the wrapped forward (engine.cpp).
void unit_pre_forward(Engine& engine, size_t unit);
/// `complete`: every tensor of the output is in `outputs` (else the unit stays gathered until the
/// end of backward, as its backward cannot be hooked).
void unit_post_forward(Engine& engine, size_t unit, const std::vector<at::Tensor>& outputs, bool complete);
/// Mixed precision's casts at the unit's boundary (nullopt: none).
std::optional<at::ScalarType> input_dtype(const Engine& engine);
std::optional<at::ScalarType> output_dtype(const Engine& engine);

}  // namespace detail

class UnitImpl : public nn::Wrapper, public nn::Checkpointable {
 public:
  /// Wraps `module` (any module with a forward). Throws tandem::Error when it is a Unit already.
  explicit UnitImpl(torch::nn::AnyModule module);
  template <typename M>
  explicit UnitImpl(torch::nn::ModuleHolder<M> module) : UnitImpl(torch::nn::AnyModule(std::move(module))) {}
  template <typename M>
  explicit UnitImpl(std::shared_ptr<M> module) : UnitImpl(torch::nn::AnyModule(std::move(module))) {}

  /// The wrapped module's forward on one tensor (what torch::nn::Sequential calls).
  at::Tensor forward(at::Tensor input) { return call<at::Tensor>(std::move(input)); }
  /// The wrapped module's forward with any arguments, returning `R`.
  template <typename R = at::Tensor, typename... Args>
  R call(Args&&... args) {
    auto engine = engine_.lock();
    if (!engine) return run<R>(std::forward<Args>(args)...);
    detail::unit_pre_forward(*engine, index_);
    const auto dtype = detail::input_dtype(*engine);
    R output = run<R>(detail::cast_argument(std::forward<Args>(args), dtype)...);
    detail::cast_output(output, detail::output_dtype(*engine));
    {
      std::vector<at::Tensor> tensors;
      const bool complete = tandem::detail::OutputTensors<R>::collect(output, tensors);
      detail::unit_post_forward(*engine, index_, tensors, complete);
    }
    return output;
  }

  /// Run the wrapped forward as one checkpointed segment (nn::checkpoint with the unit's parameters)
  /// or not. Set it before the first forward under FullyShardedDataParallel: the engine refuses a
  /// checkpointed unit that contains units when it is made.
  void set_activation_checkpointing(bool on, const nn::CheckpointOptions& options = {}) override {
    checkpoint_ = on ? std::optional<nn::CheckpointOptions>(options) : std::nullopt;
  }
  bool activation_checkpointing() const override { return checkpoint_.has_value(); }
  std::string wrapped_name() const override { return module_->name(); }

  /// Set by FullyShardedDataParallel when it takes the unit (engine.cpp).
  void attach(std::weak_ptr<detail::Engine> engine, size_t index);
  bool attached() const { return !engine_.expired(); }

 private:
  std::weak_ptr<detail::Engine> engine_;
  size_t index_ = 0;
  std::optional<nn::CheckpointOptions> checkpoint_;

  // The wrapped forward, checkpointed when asked.
  template <typename R, typename... Args>
  R run(Args&&... args) {
    if constexpr (nn::checkpointable_output<R> &&
                  (std::is_copy_constructible_v<std::decay_t<Args>> && ... && true)) {
      if (checkpoint_) {
        torch::nn::AnyModule inner = inner_;
        auto forward = [inner](auto&&... a) mutable { return inner.forward<R>(std::forward<decltype(a)>(a)...); };
        return nn::checkpoint(nn::CheckpointOptions(*checkpoint_).parameters(parameters()), forward,
                              std::forward<Args>(args)...);
      }
    } else {
      TANDEM_CHECK(!checkpoint_, "fsdp: unit '", module_->name(), "' is checkpointed, but its forward returns a ",
                   "value or takes an argument that checkpointing cannot keep: return at::Tensor, a std::vector or a ",
                   "std::tuple of tensors, and take copyable arguments");
    }
    return inner_.forward<R>(std::forward<Args>(args)...);
  }
};
TORCH_MODULE(Unit);

}  // namespace tandem::fsdp
