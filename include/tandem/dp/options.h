#pragma once
// Options of tandem::dp::DataParallel.
//
// Example:
//   auto options = tandem::dp::DataParallelOptions()
//                      .devices({torch::kCPU, torch::kCPU, torch::kCPU})   // 3 CPU replicas
//                      .mode(tandem::dp::Mode::Persistent);
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
  /// primary's once; before the next forward, parameters the optimizer changed are copied out.
  Persistent,
};

struct DataParallelOptions {
  /// One replica per entry; the first is the primary device. CUDA devices must be distinct; the
  /// CPU may appear several times (N replicas sharing the host's cores). Unset: every visible
  /// GPU, else two CPU replicas; set but empty: an error.
  DataParallelOptions& devices(std::vector<c10::Device> devices) {
    devices_ = std::move(devices);
    return *this;
  }
  const std::optional<std::vector<c10::Device>>& devices() const { return devices_; }

  /// Where outputs are gathered. Default: the primary device.
  TORCH_ARG(std::optional<c10::Device>, output_device) = std::nullopt;
  TORCH_ARG(Mode, mode) = Mode::Replicate;
  /// Intra-op threads of each CPU replica's thread. 0: the process's threads divided evenly.
  TORCH_ARG(int, threads_per_replica) = 0;

 private:
  std::optional<std::vector<c10::Device>> devices_;
};

}  // namespace tandem::dp
