#pragma once
// Per-device memory of DataParallel: the numbers behind "the primary device runs out first".
//
// Note [DataParallel memory accounting]
// - parameters, gradients: bytes of each replica's parameter and gradient tensors after the step
//   (persistent mode keeps replica gradients only until they are summed into the primary's).
// - activations: on CPU, the peak of bytes allocated through LibTorch's CPU allocator by the
//   replica's own thread during its forward and still alive (saved activations and its output;
//   a tracking allocator attributes each allocation to the replica whose thread made it; the
//   gather's output is charged to the primary). On CUDA, the caching allocator's peak of
//   allocated bytes on the device, which covers everything on that device.
// - optimizer: the state tensors of a torch::optim::SGD / Adam / AdamW / RMSprop / Adagrad
//   optimizer over the primary's parameters (momentum buffers, moments), when one is passed.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace torch::optim {
class Optimizer;
}

namespace tandem::dp {

struct DeviceMemory {
  size_t replica = 0;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t activation_peak_bytes = 0;  // CPU: tracked; CUDA: allocator peak of the whole device
  bool activations_tracked = true;    // false on CPU without DataParallelOptions::track_cpu_memory
  int64_t optimizer_bytes = 0;
  int64_t total() const { return parameter_bytes + gradient_bytes + activation_peak_bytes + optimizer_bytes; }
};

struct MemoryReport {
  std::vector<DeviceMemory> replicas;
  /// Adds the optimizer's state bytes to the primary (replica 0).
  void add_optimizer(const torch::optim::Optimizer& optimizer);
  /// "replica 0 (cpu): parameters 1.0 MB, gradients 1.0 MB, ..." one line per replica.
  std::string describe() const;
};

/// Attributes CPU allocations to replicas by thread (see the Note). One per DataParallel.
class MemoryTracker {
 public:
  explicit MemoryTracker(size_t replicas);
  ~MemoryTracker();
  /// While alive, allocations made by this thread count for `replica`.
  class Scope {
   public:
    Scope(MemoryTracker& tracker, size_t replica);
    ~Scope();

   private:
    void* previous_;
    size_t previous_slot_;
  };
  int64_t peak(size_t replica) const;
  void reset_peaks();
  void ensure(size_t replicas);

  struct Counters;  // internal

 private:
  std::shared_ptr<Counters> counters_;
};

/// Bytes of optimizer state tensors (0 for unknown optimizer types).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace tandem::dp
