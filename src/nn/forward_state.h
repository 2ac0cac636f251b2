#pragma once
// Internal: what a checkpointed segment's forward saw besides its inputs, which its recompute in
// backward must see again: the random generators' states (CPU, and CUDA per device) and the
// autocast state (per device type). PyTorch's checkpoint restores the same (get_device_states,
// fork_rng, the autocast kwargs).
#include <optional>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace tandem::nn::detail {

class RngStates {
 public:
  /// The CPU generator's state and that of the default CUDA generator of each device in `cuda`,
  /// and the tensor-parallel region's (tandem/nn/region_rng.h).
  static RngStates capture(const std::vector<c10::DeviceIndex>& cuda);
  /// Sets every generator captured back to its captured state.
  void restore() const;

 private:
  at::Tensor cpu_;
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda_;
  std::vector<std::pair<c10::Device, at::Tensor>> region_;
};

/// The CUDA devices of these tensors, each once, in order.
std::vector<c10::DeviceIndex> cuda_devices(const std::vector<at::Tensor>& tensors);

class AutocastState {
 public:
  static AutocastState capture();
  /// Sets this state (per device type: enabled, dtype).
  void apply() const;

 private:
  struct Device {
    bool enabled = false;
    at::ScalarType dtype = at::kFloat;
  };
  Device cpu_, cuda_;
};

/// Sets a captured autocast state for its lifetime, with AutocastScope's nesting and cache rules:
/// casts cached in the recompute are dropped when the outermost scope ends.
class AutocastGuard {
 public:
  explicit AutocastGuard(const AutocastState& state);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

}  // namespace tandem::nn::detail
