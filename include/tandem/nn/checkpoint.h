#pragma once
// tandem::nn::checkpoint: activation checkpointing, PyTorch's torch.utils.checkpoint for LibTorch
// (which has none). A checkpointed segment runs its forward without keeping the activations its
// backward needs, and runs that forward again inside backward to get them: one more forward per
// segment and step, for the memory of the segment's inputs instead of all its intermediates.
//
//   at::Tensor y = tandem::nn::checkpoint(block, x);           // block->forward(x), a module
//   at::Tensor z = tandem::nn::checkpoint(tandem::nn::CheckpointOptions().parameters(mlp->parameters()),
//                                         [&](const at::Tensor& a, const at::Tensor& b) { return mlp(a) * b; },
//                                         x, y);               // any function: name the parameters it reads
//
// Semantics (docs/design/activation-checkpointing.md, PyTorch's use_reentrant=False where it can):
// - the recompute draws the same random numbers as the forward did (dropout's masks are the same):
//   the CPU generator's state, and that of the CUDA generators of the devices of the inputs and
//   parameters, is saved at forward and restored around the recompute (preserve_rng_state); the
//   generators continue afterwards as if no recompute had run. The autocast state of the forward
//   is restored for the recompute too.
// - gradients reach the parameters even when no input requires one: the parameters are inputs of
//   the segment's autograd node, so DDP's and FSDP's hooks on them fire once, in the outer backward.
// - without grad mode, or when nothing the segment reads requires a gradient, it is a plain call.
// - arguments: at::Tensor, std::vector<at::Tensor> and std::optional<at::Tensor> are the segment's
//   inputs (gradients flow into them); any other argument is copied and passed again as is (a
//   tensor inside one is a constant to the segment). The function returns at::Tensor,
//   std::vector<at::Tensor> or std::tuple of tensors, with the same shapes when run again.
// - hooks run once per backward, as under torch.utils.checkpoint: a parameter's tensor hook
//   (Tensor::register_hook) and AccumulateGrad post-hooks (DDP's, FSDP's) in the outer backward;
//   a hook the segment registers on one of its own tensors in the recompute (the forward runs
//   without grad mode: register it only where the tensor requires grad, as under PyTorch's
//   reentrant checkpoint).
// - not supported: backward with create_graph (double backward).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace tandem::nn {

/// Options of one checkpointed call.
///
/// Example:
///   tandem::nn::checkpoint(tandem::nn::CheckpointOptions().parameters(net->parameters()), fn, x);
struct CheckpointOptions {
  /// Restore the random generators' states of the forward for the recompute, so that dropout
  /// draws the same masks (PyTorch's preserve_rng_state). Off: the recompute draws new numbers.
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// The tensors the function reads besides its arguments whose gradients it must produce
  /// (usually a module's parameters()). checkpoint(module, ...) takes the module's own.
  TORCH_ARG(std::vector<at::Tensor>, parameters) = {};
};

/// Whether this thread is running a checkpointed segment's recompute (inside backward).
bool in_recompute();

namespace detail {

/// A segment as its autograd node sees it: its tensor inputs in, its tensor outputs out.
using SegmentFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// The autograd side (src/nn/checkpoint.cpp): runs `run(inputs)` without keeping activations and
/// returns its outputs, attached to one autograd node that recomputes them in backward.
std::vector<at::Tensor> checkpoint_tensors(SegmentFunction run, const std::vector<at::Tensor>& inputs,
                                           const CheckpointOptions& options);
/// Whether the call needs a checkpoint at all: grad mode on and some input or parameter requires grad.
bool needs_checkpoint(const std::vector<at::Tensor>& inputs, const CheckpointOptions& options);

// The tensors of an argument, and the argument again with other tensors in their places.
template <typename T>
struct SegmentArgument {
  static void collect(const T&, std::vector<at::Tensor>&) {}
  static T replace(const T& value, const std::vector<at::Tensor>&, size_t&) { return value; }
};
template <>
struct SegmentArgument<at::Tensor> {
  static void collect(const at::Tensor& t, std::vector<at::Tensor>& out) {
    if (t.defined()) out.push_back(t);
  }
  static at::Tensor replace(const at::Tensor& t, const std::vector<at::Tensor>& in, size_t& k) {
    return t.defined() ? in.at(k++) : t;
  }
};
template <>
struct SegmentArgument<std::optional<at::Tensor>> {
  static void collect(const std::optional<at::Tensor>& t, std::vector<at::Tensor>& out) {
    if (t) SegmentArgument<at::Tensor>::collect(*t, out);
  }
  static std::optional<at::Tensor> replace(const std::optional<at::Tensor>& t, const std::vector<at::Tensor>& in,
                                           size_t& k) {
    if (!t) return t;
    return SegmentArgument<at::Tensor>::replace(*t, in, k);
  }
};
template <>
struct SegmentArgument<std::vector<at::Tensor>> {
  static void collect(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
    for (const auto& t : ts) SegmentArgument<at::Tensor>::collect(t, out);
  }
  static std::vector<at::Tensor> replace(const std::vector<at::Tensor>& ts, const std::vector<at::Tensor>& in,
                                         size_t& k) {
    std::vector<at::Tensor> out;
    for (const auto& t : ts) out.push_back(SegmentArgument<at::Tensor>::replace(t, in, k));
    return out;
  }
};

// Arguments that only view memory the caller owns: stored for the recompute in backward, they would
// dangle. Refused at compile time; pass an owning type (std::vector, std::string) instead.
template <typename T>
struct IsBorrowedView : std::false_type {};
template <typename T>
struct IsBorrowedView<c10::ArrayRef<T>> : std::true_type {};
template <typename T>
struct IsBorrowedView<c10::OptionalArrayRef<T>> : std::true_type {};
template <typename C, typename Tr>
struct IsBorrowedView<std::basic_string_view<C, Tr>> : std::true_type {};

// What a segment may return: flattened for the autograd node, rebuilt for the caller.
template <typename R>
struct SegmentOutput {
  static constexpr bool supported = false;
};
template <>
struct SegmentOutput<at::Tensor> {
  static constexpr bool supported = true;
  static std::vector<at::Tensor> flatten(at::Tensor t) { return {std::move(t)}; }
  static at::Tensor rebuild(std::vector<at::Tensor> ts) { return std::move(ts.at(0)); }
};
template <>
struct SegmentOutput<std::vector<at::Tensor>> {
  static constexpr bool supported = true;
  static std::vector<at::Tensor> flatten(std::vector<at::Tensor> ts) { return ts; }
  static std::vector<at::Tensor> rebuild(std::vector<at::Tensor> ts) { return ts; }
};
template <typename... Ts>
struct SegmentOutput<std::tuple<Ts...>> {
  static constexpr bool supported = (std::is_same_v<Ts, at::Tensor> && ...);
  static std::vector<at::Tensor> flatten(std::tuple<Ts...> t) {
    return std::apply([](auto&&... parts) { return std::vector<at::Tensor>{std::move(parts)...}; }, std::move(t));
  }
  static std::tuple<Ts...> rebuild(std::vector<at::Tensor> ts) {
    return rebuild_at(ts, std::index_sequence_for<Ts...>{});
  }
  template <size_t... I>
  static std::tuple<Ts...> rebuild_at(std::vector<at::Tensor>& ts, std::index_sequence<I...>) {
    return std::tuple<Ts...>{std::move(ts.at(I))...};
  }
};

template <typename T, typename = void>
struct IsModule : std::false_type {};
template <typename M>
struct IsModule<torch::nn::ModuleHolder<M>> : std::true_type {};
template <typename M>
struct IsModule<std::shared_ptr<M>, std::enable_if_t<std::is_base_of_v<torch::nn::Module, M>>> : std::true_type {};
// A TORCH_MODULE holder derives from ModuleHolder<Impl>.
template <typename T, typename = void>
struct IsHolder : std::false_type {};
template <typename T>
struct IsHolder<T, std::void_t<typename T::ContainedType>>
    : std::is_base_of<torch::nn::ModuleHolder<typename T::ContainedType>, T> {};
template <typename T>
constexpr bool is_module_like_v = IsModule<T>::value || IsHolder<T>::value;

template <typename F, typename... Args>
decltype(auto) invoke_segment(F& fn, Args&&... args) {
  if constexpr (is_module_like_v<F>) {
    return fn->forward(std::forward<Args>(args)...);
  } else {
    return std::invoke(fn, std::forward<Args>(args)...);
  }
}

}  // namespace detail

/// Whether a checkpointed segment may return R: at::Tensor, std::vector<at::Tensor>, or a
/// std::tuple of tensors (what checkpoint flattens for its autograd node and rebuilds).
template <typename R>
inline constexpr bool checkpointable_output = detail::SegmentOutput<R>::supported;

/// Runs fn(args...) as a checkpointed segment (see the top of this file). `fn` is a module
/// (holder or shared_ptr: its forward, its parameters) or any callable, whose parameters
/// `options.parameters()` names.
template <typename Fn, typename... Args>
auto checkpoint(const CheckpointOptions& options, Fn&& fn, Args&&... args) {
  using F = std::decay_t<Fn>;
  using R = std::decay_t<decltype(detail::invoke_segment(std::declval<F&>(), std::declval<std::decay_t<Args>&>()...))>;
  static_assert(detail::SegmentOutput<R>::supported,
                "tandem::nn::checkpoint: the function must return at::Tensor, std::vector<at::Tensor> or a std::tuple "
                "of at::Tensor");
  static_assert(!(detail::IsBorrowedView<std::decay_t<Args>>::value || ...),
                "tandem::nn::checkpoint: an argument is a view (ArrayRef, string_view) of memory the caller "
                "owns; the recompute in backward runs after it may be gone: pass an owning type");
  CheckpointOptions with_parameters = options;
  if constexpr (detail::is_module_like_v<F>) {
    if (with_parameters.parameters().empty()) with_parameters.parameters(fn->parameters());
  }
  std::vector<at::Tensor> inputs;
  (detail::SegmentArgument<std::decay_t<Args>>::collect(args, inputs), ...);
  if (!detail::needs_checkpoint(inputs, with_parameters)) {
    return R(detail::invoke_segment(fn, std::forward<Args>(args)...));
  }
  // The arguments are kept (copied) for the recompute; its tensors come from the autograd node.
  auto kept = std::make_shared<std::tuple<F, std::decay_t<Args>...>>(std::forward<Fn>(fn), std::forward<Args>(args)...);
  detail::SegmentFunction run = [kept](const std::vector<at::Tensor>& tensors) {
    return std::apply(
        [&tensors](F& callable, const std::decay_t<Args>&... stored) {
          size_t k = 0;
          // Braced: the arguments are replaced in order, left to right.
          std::tuple<std::decay_t<Args>...> replaced{detail::SegmentArgument<std::decay_t<Args>>::replace(stored, tensors, k)...};
          return std::apply(
              [&callable](auto&... a) { return detail::SegmentOutput<R>::flatten(R(detail::invoke_segment(callable, a...))); },
              replaced);
        },
        *kept);
  };
  return detail::SegmentOutput<R>::rebuild(detail::checkpoint_tensors(std::move(run), inputs, with_parameters));
}

/// checkpoint with the default options: a module's parameters, or a function of its arguments only.
template <typename Fn, typename... Args,
          typename = std::enable_if_t<!std::is_same_v<std::decay_t<Fn>, CheckpointOptions>>>
auto checkpoint(Fn&& fn, Args&&... args) {
  return checkpoint(CheckpointOptions(), std::forward<Fn>(fn), std::forward<Args>(args)...);
}

}  // namespace tandem::nn

namespace tandem {
using nn::checkpoint;
}  // namespace tandem
