#pragma once
// Deterministic tensors of every safetensors dtype and several shapes (0-dim, empty, 1- to
// 4-dim), built from arange so that both sides of the interop test can build them independently:
// tests/accelerate/safetensors_interop.py builds the very same set with Python's torch.
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace tandem::test {

struct RecipeDtype {
  const char* name;
  at::ScalarType type;
};

inline const std::vector<RecipeDtype>& recipe_dtypes() {
  static const std::vector<RecipeDtype> dtypes = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool}};
  return dtypes;
}

inline const std::vector<std::vector<int64_t>>& recipe_shapes() {
  static const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {3}, {2, 3}, {2, 0, 4}, {1, 2, 3, 2}};
  return shapes;
}

/// The values of `n` elements of `type`, computed in int64/float64 and then cast (Python:
/// the same torch operations).
inline at::Tensor recipe_values(at::ScalarType type, int64_t n) {
  at::Tensor i = at::arange(n, at::kLong);
  switch (type) {
    case at::kDouble:
    case at::kFloat:
    case at::kHalf:
    case at::kBFloat16:
      return ((i.to(at::kDouble) - static_cast<double>(n / 2)) * 0.25).to(type);  // exact in every float type
    case at::kLong:
      return (i * 1000000007LL - (1LL << 40)).to(type);
    case at::kInt:
      return (i * 65537 - (1 << 20)).to(type);
    case at::kShort:
      return (i * 101 - 3000).to(type);
    case at::kChar:
      return ((i * 7) % 256 - 128).to(type);
    case at::kByte:
      return ((i * 37) % 256).to(type);
    case at::kBool:
      return (i % 3).eq(0);
    default:
      break;
  }
  throw std::invalid_argument("recipe: unexpected dtype");
}

/// "F32.s3" -> Float[2, 3], ...: every dtype in every shape, plus a larger F32 tensor and the
/// special float values (NaN, infinities, -0, the smallest denormal).
inline std::vector<std::pair<std::string, at::Tensor>> recipe_tensors() {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& d : recipe_dtypes()) {
    for (size_t s = 0; s < recipe_shapes().size(); ++s) {
      const auto& shape = recipe_shapes()[s];
      int64_t n = 1;
      for (int64_t dim : shape) n *= dim;
      tensors.emplace_back(std::string(d.name) + ".s" + std::to_string(s), recipe_values(d.type, n).reshape(shape));
    }
  }
  tensors.emplace_back("F32.big", recipe_values(at::kFloat, 256 * 33).reshape({256, 33}));
  const float inf = std::numeric_limits<float>::infinity();
  tensors.emplace_back("F32.special", at::tensor({std::numeric_limits<float>::quiet_NaN(), inf, -inf, -0.0f, 1e-45f}));
  return tensors;
}

inline std::map<std::string, std::string> recipe_metadata() {
  return {{"format", "pt"}, {"note", "tandem \u2713 \"quoted\" \\ \n\t\x01\x7f"}};
}

}  // namespace tandem::test
