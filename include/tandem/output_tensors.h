#pragma once
// The tensors of a module's forward output, whatever its type (a tensor, a tuple, a vector...):
// DDP looks into them for find_unused_parameters and to notice that backward started, FSDP to
// hook each unit's backward. Internal to the wrappers' templates (not API).
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace tandem::detail {

// collect() appends the tensors and returns false when part of the value could not be looked into.
template <typename T>
struct OutputTensors {  // numbers and strings hold no tensor; any other type is opaque to the wrappers
  static bool collect(const T&, std::vector<at::Tensor>&) {
    return std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string>;
  }
};
template <>
struct OutputTensors<at::Tensor> {
  static bool collect(const at::Tensor& t, std::vector<at::Tensor>& out) {
    out.push_back(t);
    return true;
  }
};
template <typename T>
struct OutputTensors<std::vector<T>> {
  static bool collect(const std::vector<T>& values, std::vector<at::Tensor>& out) {
    bool complete = true;
    for (const auto& v : values) complete = OutputTensors<T>::collect(v, out) && complete;
    return complete;
  }
};
template <typename T>
struct OutputTensors<std::optional<T>> {
  static bool collect(const std::optional<T>& value, std::vector<at::Tensor>& out) {
    return !value || OutputTensors<T>::collect(*value, out);
  }
};
template <typename... Ts>
struct OutputTensors<std::tuple<Ts...>> {
  static bool collect(const std::tuple<Ts...>& tuple, std::vector<at::Tensor>& out) {
    return std::apply([&](const auto&... parts) {
      return (OutputTensors<std::decay_t<decltype(parts)>>::collect(parts, out) & ... & true);
    }, tuple);
  }
};
template <typename A, typename B>
struct OutputTensors<std::pair<A, B>> {
  static bool collect(const std::pair<A, B>& pair, std::vector<at::Tensor>& out) {
    const bool first = OutputTensors<A>::collect(pair.first, out);
    return OutputTensors<B>::collect(pair.second, out) && first;
  }
};

}  // namespace tandem::detail
