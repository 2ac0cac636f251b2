// AutocastScope: LibTorch's autocast turned on and off by a C++ scope, nested as torch.autocast.
#include <gtest/gtest.h>

#include <thread>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/ThreadLocalState.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>

#include "support/errors.h"
#include "tandem/amp/autocast.h"

using tandem::amp::AutocastScope;

namespace {

at::ScalarType linear_dtype(torch::nn::Linear& linear, const c10::Device& device = c10::kCPU) {
  return linear->forward(at::randn({2, 4}, at::TensorOptions().device(device))).scalar_type();
}

}  // namespace

TEST(AutocastScope, Bf16OnCpuInsideTheScopeFloat32Outside) {
  torch::nn::Linear linear(4, 3);
  EXPECT_EQ(linear_dtype(linear), at::kFloat);
  EXPECT_FALSE(AutocastScope::is_enabled(c10::kCPU));
  {
    AutocastScope autocast(c10::kCPU, at::kBFloat16);
    EXPECT_TRUE(AutocastScope::is_enabled(c10::kCPU));
    EXPECT_EQ(linear_dtype(linear), at::kBFloat16);
    // An op on the float32 list runs in float32 whatever its input.
    auto y = linear->forward(at::randn({2, 4}));
    EXPECT_EQ(torch::nn::functional::mse_loss(y, at::zeros({2, 3})).scalar_type(), at::kFloat);
    EXPECT_EQ(linear->weight.scalar_type(), at::kFloat);  // parameters are not converted
  }
  EXPECT_FALSE(AutocastScope::is_enabled(c10::kCPU));
  EXPECT_EQ(linear_dtype(linear), at::kFloat);
}

TEST(AutocastScope, Fp16OnCpuRunsLinearInHalf) {
  // LibTorch 2.11 registers CPU autocast kernels for float16 as well (linear, matmul, conv).
  torch::nn::Linear linear(4, 3);
  AutocastScope autocast(c10::kCPU, at::kHalf);
  EXPECT_EQ(linear_dtype(linear), at::kHalf);
  EXPECT_EQ(at::matmul(at::randn({2, 4}), at::randn({4, 2})).scalar_type(), at::kHalf);
}

TEST(AutocastScope, GradientsOfFloat32ParametersStayFloat32) {
  torch::nn::Linear linear(4, 3);
  at::Tensor loss;
  {
    AutocastScope autocast(c10::kCPU, at::kBFloat16);
    loss = linear->forward(at::randn({2, 4})).sum();
  }
  loss.backward();
  EXPECT_EQ(linear->weight.grad().scalar_type(), at::kFloat);
}

TEST(AutocastScope, NestedScopesRestoreWhatTheyFound) {
  torch::nn::Linear linear(4, 3);
  const at::ScalarType default_dtype = AutocastScope::dtype(c10::kCPU);
  {
    AutocastScope outer(c10::kCPU, at::kBFloat16);
    {
      AutocastScope inner(c10::kCPU, at::kHalf);
      EXPECT_EQ(linear_dtype(linear), at::kHalf);
      {
        AutocastScope off(c10::kCPU, at::kHalf, /*enabled=*/false);
        EXPECT_FALSE(AutocastScope::is_enabled(c10::kCPU));
        EXPECT_EQ(linear_dtype(linear), at::kFloat);
      }
      EXPECT_TRUE(AutocastScope::is_enabled(c10::kCPU));
      EXPECT_EQ(AutocastScope::dtype(c10::kCPU), at::kHalf);
    }
    EXPECT_TRUE(AutocastScope::is_enabled(c10::kCPU));
    EXPECT_EQ(AutocastScope::dtype(c10::kCPU), at::kBFloat16);
    EXPECT_EQ(linear_dtype(linear), at::kBFloat16);
  }
  EXPECT_FALSE(AutocastScope::is_enabled(c10::kCPU));
  EXPECT_EQ(AutocastScope::dtype(c10::kCPU), default_dtype);
  EXPECT_EQ(linear_dtype(linear), at::kFloat);
}

TEST(AutocastScope, NestedScopesWithAnotherDtypeDoNotReuseTheOuterCast) {
  // PyTorch 2.11 fails both ways ("mat1 and mat2 must have the same dtype"): its weight cache is
  // keyed by the weight alone. Ours is cleared when a scope changes the dtype.
  torch::nn::Linear linear(4, 3);
  {
    AutocastScope outer(c10::kCPU, at::kBFloat16);
    EXPECT_EQ(linear_dtype(linear), at::kBFloat16);  // caches a bf16 copy of the weight
    {
      AutocastScope inner(c10::kCPU, at::kHalf);
      EXPECT_EQ(linear_dtype(linear), at::kHalf);
    }
    EXPECT_EQ(linear_dtype(linear), at::kBFloat16);
  }
  {
    AutocastScope outer(c10::kCPU, at::kHalf);
    {
      AutocastScope inner(c10::kCPU, at::kBFloat16);
      EXPECT_EQ(linear_dtype(linear), at::kBFloat16);
      {
        AutocastScope off(c10::kCPU, at::kBFloat16, /*enabled=*/false);
        EXPECT_EQ(linear_dtype(linear), at::kFloat);
      }
      EXPECT_EQ(linear_dtype(linear), at::kBFloat16);
    }
    EXPECT_EQ(linear_dtype(linear), at::kHalf);
  }
}

TEST(AutocastScope, CpuScopeLeavesCudaAutocastAlone) {
  AutocastScope autocast(c10::kCPU, at::kBFloat16);
  EXPECT_FALSE(AutocastScope::is_enabled(c10::kCUDA));
}

TEST(AutocastScope, IsPerThreadAsInPyTorch) {
  torch::nn::Linear linear(4, 3);
  AutocastScope autocast(c10::kCPU, at::kBFloat16);
  at::ScalarType in_thread = at::kBFloat16;
  std::thread([&] { in_thread = linear_dtype(linear); }).join();
  EXPECT_EQ(in_thread, at::kFloat);
}

TEST(AutocastScope, ThreadLocalStateCarriesItIntoAThread) {
  // What DataParallel does for its replica threads (src/dp/data_parallel.cpp).
  torch::nn::Linear linear(4, 3);
  AutocastScope autocast(c10::kCPU, at::kHalf);
  const at::ThreadLocalState caller;
  at::ScalarType in_thread = at::kFloat;
  std::thread([&] {
    at::ThreadLocalStateGuard guard(caller);
    in_thread = linear_dtype(linear);
  }).join();
  EXPECT_EQ(in_thread, at::kHalf);
}

TEST(AutocastScope, RefusesOtherDtypesAndDevices) {
  EXPECT_ERROR(AutocastScope(c10::kCPU, at::kFloat), "AutocastScope: dtype Float is not supported: expected BFloat16 or Half");
  EXPECT_ERROR(AutocastScope(c10::kMPS, at::kHalf), "AutocastScope: device type mps is not supported: expected cpu or cuda");
  EXPECT_FALSE(AutocastScope::is_enabled(c10::kCPU));  // a refused scope changed nothing
}

TEST(AutocastScope, Cuda) {
  if (!at::hasCUDA()) {
    EXPECT_ERROR(AutocastScope(c10::kCUDA, at::kHalf),
                 "AutocastScope: cuda autocast needs a CUDA device, and none is visible (or LibTorch was loaded "
                 "without CUDA): use c10::kCPU");
    return;
  }
  torch::nn::Linear linear(4, 3);
  linear->to(c10::Device(c10::kCUDA, 0));
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    AutocastScope autocast(c10::kCUDA, dtype);
    EXPECT_EQ(linear_dtype(linear, c10::Device(c10::kCUDA, 0)), dtype);
    EXPECT_FALSE(AutocastScope::is_enabled(c10::kCPU));
  }
  EXPECT_EQ(linear_dtype(linear, c10::Device(c10::kCUDA, 0)), at::kFloat);
}
