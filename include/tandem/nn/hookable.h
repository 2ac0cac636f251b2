#pragma once
// tandem::nn::Hookable: forward hooks for a LibTorch module (PyTorch's register_forward_pre_hook
// and register_forward_hook, which LibTorch lacks). Declare a member as Hookable where code must
// run around its forward: tensor parallelism's plans (tandem/tp/parallelize.h) install their
// collectives there.
//
//   q = register_module("q", tandem::nn::Hookable(torch::nn::Linear(dim, dim)));
//   at::Tensor y = q(x);                               // hooks, then Linear's forward, then hooks
//   q->add_forward_pre_hook([](size_t i, const at::Tensor& x) { return x * 2; });
//   auto& linear = q->module()->as<torch::nn::Linear>();   // the wrapped module
//   q->set_activation_checkpointing(true);             // its forward recomputed in backward, hooks outside
//
// Like tandem::fsdp::Unit it adopts the wrapped module's parameters, buffers and children under
// their own names (tandem/nn/wrapper.h): "q.weight" stays "q.weight".
#include <cstddef>
#include <functional>
#include <tuple>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/pimpl.h>

#include "tandem/error.h"
#include "tandem/nn/checkpoint.h"
#include "tandem/nn/wrapper.h"

namespace tandem::nn {

class HookableImpl : public Wrapper {
 public:
  /// Runs before the wrapped forward on each at::Tensor argument (`position`: its place among
  /// all the arguments); what it returns is what the forward gets.
  using PreHook = std::function<at::Tensor(size_t position, const at::Tensor& input)>;
  /// Runs on the forward's output (a module whose forward returns at::Tensor); what it returns is
  /// the module's output.
  using PostHook = std::function<at::Tensor(const at::Tensor& output)>;

  explicit HookableImpl(torch::nn::AnyModule module);
  template <typename M>
  explicit HookableImpl(torch::nn::ModuleHolder<M> module) : HookableImpl(torch::nn::AnyModule(std::move(module))) {}
  template <typename M>
  explicit HookableImpl(std::shared_ptr<M> module) : HookableImpl(torch::nn::AnyModule(std::move(module))) {}

  /// The wrapped module's forward on one tensor (what torch::nn::Sequential calls).
  at::Tensor forward(at::Tensor input) { return call<at::Tensor>(std::move(input)); }
  /// The wrapped module's forward with any arguments, returning `R`, between the hooks.
  template <typename R = at::Tensor, typename... Args>
  R call(Args&&... args) {
    return call_indexed<R>(std::index_sequence_for<Args...>{}, std::forward<Args>(args)...);
  }

  /// Hooks run in the order they were added.
  void add_forward_pre_hook(PreHook hook) { pre_.push_back(std::move(hook)); }
  void add_forward_hook(PostHook hook) { post_.push_back(std::move(hook)); }
  bool has_hooks() const { return !pre_.empty() || !post_.empty(); }
  void clear_hooks() {
    pre_.clear();
    post_.clear();
  }
  /// Activation checkpointing of the wrapped forward (checkpoint_modules sets it for a Hookable the
  /// policy picks, wherever it is held): the forward between the hooks is one checkpointed
  /// segment; the hooks (tensor parallelism's collectives) run outside the recompute.
  void set_activation_checkpointing(bool on, const CheckpointOptions& options = {}) {
    checkpoint_ = on ? std::optional<CheckpointOptions>(options) : std::nullopt;
  }
  bool activation_checkpointing() const { return checkpoint_.has_value(); }

 private:
  std::vector<PreHook> pre_;
  std::vector<PostHook> post_;
  std::optional<CheckpointOptions> checkpoint_;

  template <typename R, typename... A>
  R run_inner(A&&... args) {
    if constexpr (checkpointable_output<R> && (std::is_copy_constructible_v<std::decay_t<A>> && ... && true)) {
      if (checkpoint_) {
        torch::nn::AnyModule inner = inner_;
        auto forward = [inner](auto&&... a) mutable { return inner.forward<R>(std::forward<decltype(a)>(a)...); };
        return nn::checkpoint(CheckpointOptions(*checkpoint_).parameters(parameters()), forward,
                              std::forward<A>(args)...);
      }
    } else {
      TANDEM_CHECK(!checkpoint_, "nn::Hookable: '", module_->name(), "' is checkpointed, but its forward returns a ",
                   "value or takes an argument that checkpointing cannot keep");
    }
    return inner_.forward<R>(std::forward<A>(args)...);
  }

  template <typename R, size_t... I, typename... Args>
  R call_indexed(std::index_sequence<I...>, Args&&... args) {
    // A braced list runs the pre-hooks left to right (a call's arguments have no order in C++):
    // hooks that run collectives must run in one order on every process.
    std::tuple<decltype(before(I, std::forward<Args>(args)))...> converted{before(I, std::forward<Args>(args))...};
    R output = std::apply([this](auto&&... a) { return run_inner<R>(std::forward<decltype(a)>(a)...); },
                          std::move(converted));
    if constexpr (std::is_same_v<R, at::Tensor>) {
      for (const auto& hook : post_) output = hook(output);
    } else {
      TANDEM_CHECK(post_.empty(), "nn::Hookable: '", module_->name(),
                   "' has forward hooks, which take a module returning one at::Tensor");
    }
    return output;
  }
  template <typename A>
  decltype(auto) before(size_t position, A&& argument) {
    if constexpr (std::is_same_v<std::decay_t<A>, at::Tensor>) {
      at::Tensor tensor = std::forward<A>(argument);
      for (const auto& hook : pre_) tensor = hook(position, tensor);
      return tensor;
    } else {
      return std::forward<A>(argument);
    }
  }
};
TORCH_MODULE(Hookable);

}  // namespace tandem::nn
