#pragma once
// Comparisons the oracle tests share.
#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem::test {

/// max over tensors of max|a - b| / max|b|: the per-tensor worst relative difference.
double max_relative_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);
/// ||a - b|| / ||b|| over all tensors together: for lossy reductions, where a per-tensor maximum
/// is dominated by the few smallest values.
double global_relative_l2(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);
/// max|a - b| in double precision.
double max_abs_difference(const at::Tensor& a, const at::Tensor& b);

}  // namespace tandem::test
