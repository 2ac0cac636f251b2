#pragma once
// Comparisons the oracle tests share.
#include <vector>

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

namespace tandem::test {

/// max over tensors of max|a - b| / max|b|: the per-tensor worst relative difference.
double max_relative_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);
/// ||a - b|| / ||b|| over all tensors together: for lossy reductions, where a per-tensor maximum
/// is dominated by the few smallest values.
double global_relative_l2(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);
/// max|a - b| <= rtol * max|b| + atol, in double precision: a bound that scales with the tensor
/// compared. Two computations of one result in different summation orders (a pipeline against one
/// process, a cut layer against the whole) differ by a few roundings of the *terms*, which an
/// element near zero does not bound: elementwise allclose(rtol, tiny atol) then passes on one CPU's
/// kernels and fails on another's (issue 43: AVX-512 against AVX2). Never stricter than
/// at::allclose with the same rtol and atol. The message names the largest difference and the bound.
::testing::AssertionResult close_at_scale(const at::Tensor& a, const at::Tensor& b, double rtol, double atol = 0);
/// max|a - b| in double precision.
double max_abs_difference(const at::Tensor& a, const at::Tensor& b);

}  // namespace tandem::test
