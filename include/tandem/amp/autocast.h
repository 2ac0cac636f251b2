#pragma once
// AutocastScope: LibTorch's autocast (automatic mixed precision) for the length of a C++ scope,
// what `with torch.autocast(device_type, dtype):` is in Python.
//
// Inside the scope, the ops on autocast's lists run in `dtype` (matmul, linear, conv) or in
// float32 (most losses, e.g. mse_loss), whatever their inputs; parameters and their gradients
// stay float32. The lists differ between CPU and CUDA (docs/guide-amp.md). Scopes nest:
// each restores the enabled state and dtype it found, and the outermost one, on exit, drops the
// cache of weights autocast cast inside it. Unlike torch.autocast, nested scopes with different
// dtypes work (Note [Autocast cache across dtypes] in autocast.cpp).
//
// Autocast state is per thread, as in PyTorch: a scope does not reach threads started inside it
// (DataParallel's replica threads); open a scope in each thread that should autocast.
//
// Example:
//   at::Tensor loss;
//   {
//     tandem::amp::AutocastScope autocast(c10::kCPU, at::kBFloat16);
//     loss = torch::nll_loss(model->forward(x), y);        // linear layers in bfloat16
//   }
//   loss.backward();                                      // backward outside, as in PyTorch
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace tandem::amp {

class AutocastScope {
 public:
  /// Autocast for `device_type` (CPU or CUDA) with `dtype` (at::kBFloat16 or at::kHalf), or with
  /// `enabled` false, a region where autocast is off inside an enclosing scope. Throws
  /// tandem::Error for another device type or dtype, and for CUDA when no GPU is visible.
  AutocastScope(c10::DeviceType device_type, at::ScalarType dtype, bool enabled = true);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  AutocastScope(AutocastScope&&) = delete;
  AutocastScope& operator=(AutocastScope&&) = delete;

  /// Whether autocast is on for `device_type` in this thread, and the dtype it casts to there
  /// (LibTorch's defaults: bfloat16 on CPU, float16 on CUDA).
  static bool is_enabled(c10::DeviceType device_type);
  static at::ScalarType dtype(c10::DeviceType device_type);

 private:
  c10::DeviceType device_type_;
  at::ScalarType dtype_;
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
};

}  // namespace tandem::amp
