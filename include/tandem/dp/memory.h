#pragma once
// Per-device memory of DataParallel: the numbers behind "the primary device runs out first".
//
// Note [DataParallel memory accounting]
// - parameters, gradients: bytes of each replica's parameter and gradient tensors after the step
//   (persistent mode keeps replica gradients only until they are summed into the primary's).
// - optimizer: the state tensors of a torch::optim::SGD / Adam / AdamW / RMSprop / Adagrad
//   optimizer over the primary's parameters (momentum buffers, moments), when one is passed.
// - activations, on CPU: the peak of bytes allocated through LibTorch's CPU allocator by the
//   replica's own thread during its forward and still alive (saved activations and its output;
//   a CpuMemoryTracker, src/common/cpu_memory_tracker.h, attributes each allocation to the
//   replica whose thread made it; the gather's output is charged to the primary). total() is the sum of the four figures.
// - on CUDA, the one measurement is the caching allocator's peak of allocated bytes on the
//   device (device_peak_bytes), and it already holds everything on that device: parameters,
//   gradients, optimizer state, activations, the gathered output, the loss, and whatever else
//   the program keeps there. So total() is that peak, and the activation figure is what is left
//   of it once parameters, gradients and optimizer state are taken out, clamped at 0 (peaks
//   reset after a step may hold less than those three; total() is still the peak then, below
//   the sum of the figures). Adding them to the peak once more would count them twice.
//   derive_activations() does the subtraction; memory_report() and add_optimizer() call it.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace torch::optim {
class Optimizer;
}

namespace tandem::dp {

/// One replica's bytes (Note [DataParallel memory accounting]).
struct DeviceMemory {
  size_t replica = 0;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  /// CPU: the tracked peak of the replica's own allocations. CUDA: the device peak less
  /// parameters, gradients and optimizer state (at least 0).
  int64_t activation_peak_bytes = 0;
  bool activations_tracked = true;  // false on CPU without DataParallelOptions::track_cpu_memory
  int64_t optimizer_bytes = 0;
  /// CUDA: the caching allocator's peak of allocated bytes on the whole device, which already
  /// holds the four figures above. Unset on CPU.
  std::optional<int64_t> device_peak_bytes;

  /// CUDA: the device peak. CPU: parameters + gradients + optimizer + activations (if tracked).
  int64_t total() const;
  /// CUDA: activation_peak_bytes = max(0, device peak - parameters - gradients - optimizer);
  /// nothing elsewhere. Call it again after changing a figure by hand.
  void derive_activations();
};

struct MemoryReport {
  std::vector<DeviceMemory> replicas;
  /// Adds the optimizer's state bytes to the primary (replica 0), whose activation figure then
  /// shrinks by as much on CUDA (the device peak already held them).
  void add_optimizer(const torch::optim::Optimizer& optimizer);
  /// "replica 0 (cpu): parameters 1.0 MB, gradients 1.0 MB, ..." one line per replica.
  std::string describe() const;
};

/// Bytes of optimizer state tensors (0 for unknown optimizer types).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace tandem::dp
