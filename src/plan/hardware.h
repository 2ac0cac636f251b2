#pragma once
// The hardware `tandem plan` plans for: one node's devices, their memory, compute rate and links
// (Note [Hardware profiles] in hardware.cpp). Built-in profiles, or a JSON file of the same fields.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/projection.h"

namespace tandem::plan {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Profile {
  std::string name, description;
  std::string device = "cuda";       // "cuda" or "cpu" (then a device is one process)
  int devices_per_node = 8, nodes = 1;
  int compute_units = 0;             // cores the devices share (CPU); 0: one per device
  int64_t memory_bytes = 0;          // per device, what a process may use
  int64_t runtime_bytes = 0;         // per process: the runtime's own (LibTorch, CUDA context, NCCL)
  double fp32_flops = 0, bf16_flops = 0;  // dense peak per device (per compute unit on a CPU)
  double efficiency = 1.0;           // the share of the peak a training step's matmuls reach
  double memory_bandwidth = 0;       // bytes/s per device: what elementwise work and the optimizer stream
  bench::Link intra, inter;          // bus bandwidth and latency inside a node and between nodes
  double overlap = 1.0;              // the share of backward (or compute) that hides data-parallel traffic
  double op_overhead_s = 0;          // host time per operator that the device does not hide (CPU: dispatch)

  int devices() const { return devices_per_node * nodes; }
  /// FLOP/s one device reaches at `precision` ("fp32" or "bf16"), devices sharing cores included.
  double achieved_flops(const std::string& precision) const;
  /// The share of a compute unit one device has: compute_units / devices_per_node when more
  /// processes than cores share a node, else 1.
  double share() const;
};

/// "h100-8x", "h200-8x", "a100-8x", "cpu" (this kind of 2-core machine, measured): the built-ins.
std::vector<std::string> profile_names();
/// A built-in by name, or a JSON file (a path: it contains '/' or ends in .json). Throws
/// tandem::Error with one line for an unknown name, an unreadable file or a bad field.
Profile load_profile(const std::string& name_or_path);
/// The profile as the JSON a file holds (what `tandem plan --show-profile NAME` prints to edit).
nlohmann::json profile_json(const Profile& profile);
Profile profile_from_json(const nlohmann::json& j, const std::string& where);
/// Devices per node and nodes positive, at most 2^20 devices in all: else one line from `where`.
void check_devices(const Profile& profile, const std::string& where);

}  // namespace tandem::plan
