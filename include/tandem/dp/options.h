#pragma once
// Options of tandem::dp::DataParallel.
#include <optional>
#include <vector>

#include <c10/core/Device.h>
#include <torch/arg.h>

namespace tandem::dp {

enum class Mode {
  /// PyTorch's semantics: the primary module is copied to every device on every forward, and
  /// backward sums the replicas' gradients into the primary's parameters through autograd.
  Replicate,
  /// Ours: replicas are made once and kept. After backward their gradients are summed into the
  /// primary's once; before each forward the primary's parameters and buffers are copied out.
  Persistent,
};

/// Options of DataParallel.
///
/// Example:
///   auto options = tandem::dp::DataParallelOptions()
///                      .devices({torch::kCPU, torch::kCPU, torch::kCPU})   // 3 CPU replicas
///                      .mode(tandem::dp::Mode::Persistent)
///                      .track_cpu_memory(true);
struct DataParallelOptions {
  /// One replica per entry; the first is the primary device. CUDA devices must be distinct; the
  /// CPU may appear several times (N replicas sharing the host's cores). Unset: every visible
  /// GPU, else two CPU replicas; set but empty: an error.
  TORCH_ARG(std::optional<std::vector<c10::Device>>, devices) = std::nullopt;
  /// Where outputs are gathered. Unset: the primary device.
  TORCH_ARG(std::optional<c10::Device>, output_device) = std::nullopt;
  /// How replicas are made and kept (see Mode).
  TORCH_ARG(Mode, mode) = Mode::Replicate;
  /// Intra-op threads of each CPU replica's thread. 0: the process's threads divided evenly.
  TORCH_ARG(int, threads_per_replica) = 0;
  /// Attribute CPU allocations to replicas, for memory_report()'s activation figures on CPU.
  /// Off by default: it wraps LibTorch's CPU allocator for the whole process (one map insert and
  /// erase under a mutex per tracked allocation; docs/guide-dp.md has its measured cost).
  TORCH_ARG(bool, track_cpu_memory) = false;

 public:
  /// `.devices({torch::kCPU, torch::kCPU})`: a braced list cannot initialize the optional.
  DataParallelOptions& devices(std::vector<c10::Device> list) {
    devices_ = std::move(list);
    return *this;
  }
};

}  // namespace tandem::dp
