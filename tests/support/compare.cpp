#include "support/compare.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace tandem::test {

double max_relative_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double scale = std::max(b[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i].cpu() - b[i].cpu()).abs().max().item<double>() / scale);
  }
  return worst;
}

double global_relative_l2(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (a[i].cpu() - b[i].cpu()).to(at::kDouble).pow(2).sum().item<double>();
    norm += b[i].cpu().to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

::testing::AssertionResult close_at_scale(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  if (a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure() << "shapes differ: " << a.sizes() << " vs " << b.sizes();
  }
  if (b.numel() == 0) return ::testing::AssertionSuccess();
  const double difference = max_abs_difference(a, b);
  const double scale = b.detach().cpu().to(at::kDouble).abs().max().item<double>();
  const double bound = rtol * scale + atol;
  if (difference <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "largest difference " << difference << " above " << bound << " (" << rtol
                                       << " x the largest magnitude " << scale << " + " << atol << ")";
}

double max_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().cpu().to(at::kDouble) - b.detach().cpu().to(at::kDouble)).abs().max().item<double>();
}

}  // namespace tandem::test
