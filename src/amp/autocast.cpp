#include "tandem/amp/autocast.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "tandem/error.h"

namespace tandem::amp {

// Note [Autocast cache across dtypes]: autocast caches the cast copy of each float32 weight
// (a leaf that requires grad) until the outermost scope ends, keyed by the weight alone, not by
// the dtype it was cast to. So in PyTorch 2.11 a Linear used in a bf16 scope and then in a nested
// fp16 scope (or the reverse) gets the bf16 copy in fp16 and fails ("mat1 and mat2 must have the
// same dtype"). We clear the cache whenever a scope changes the dtype, entering or leaving: the
// cache then only ever holds casts to the current dtype. Cost: the weights are cast again after
// such a change. (The cache is per thread, shared by every device type; clearing it drops CPU and
// CUDA casts alike, which costs time, never correctness: the autograd graph keeps its own
// references.)
AutocastScope::AutocastScope(c10::DeviceType device_type, at::ScalarType dtype, bool enabled)
    : device_type_(device_type), dtype_(dtype) {
  TANDEM_CHECK(device_type == c10::kCPU || device_type == c10::kCUDA, "AutocastScope: device type ",
               c10::DeviceTypeName(device_type, /*lower_case=*/true), " is not supported: expected cpu or cuda");
  TANDEM_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "AutocastScope: dtype ", c10::toString(dtype),
               " is not supported: expected BFloat16 or Half");
  TANDEM_CHECK(!enabled || device_type != c10::kCUDA || at::hasCUDA(),
               "AutocastScope: cuda autocast needs a CUDA device, and none is visible (or LibTorch was loaded "
               "without CUDA): use c10::kCPU");
  // torch.autocast.__enter__: remember, set, count the nesting.
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
  // Note [Autocast cache across dtypes]
  if (dtype != previous_dtype_) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  // torch.autocast.__exit__: the cached casts of weights live until the outermost scope ends,
  // or until the dtype changes back (Note [Autocast cache across dtypes]).
  if (at::autocast::decrement_nesting() == 0 || dtype_ != previous_dtype_) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

bool AutocastScope::is_enabled(c10::DeviceType device_type) { return at::autocast::is_autocast_enabled(device_type); }

at::ScalarType AutocastScope::dtype(c10::DeviceType device_type) {
  return at::autocast::get_autocast_dtype(device_type);
}

}  // namespace tandem::amp
