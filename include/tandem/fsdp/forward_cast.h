#pragma once
// Mixed precision at module boundaries (FSDP2's cast_forward_inputs and output_dtype): the
// floating-point tensors among a forward's arguments, and a tensor output, cast to a dtype.
#include <optional>
#include <type_traits>
#include <utility>

#include <ATen/ATen.h>

namespace tandem::fsdp::detail {

inline at::Tensor cast_floating(const at::Tensor& t, const std::optional<at::ScalarType>& dtype) {
  if (!dtype || !t.defined() || !t.is_floating_point() || t.scalar_type() == *dtype) return t;
  return t.to(*dtype);
}

/// A tensor argument cast (a new handle), anything else forwarded untouched.
template <typename T>
decltype(auto) cast_argument(T&& arg, const std::optional<at::ScalarType>& dtype) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return cast_floating(arg, dtype);
  } else {
    return std::forward<T>(arg);
  }
}

/// A tensor output cast; an output of another type is returned as it is.
template <typename R>
void cast_output(R& output, const std::optional<at::ScalarType>& dtype) {
  if constexpr (std::is_same_v<R, at::Tensor>) output = cast_floating(output, dtype);
}

}  // namespace tandem::fsdp::detail
