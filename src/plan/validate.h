#pragma once
// The plan against measurement: every probe that fit in a `tandem bench --memory-budget` run
// (its results.json), predicted with a CPU profile and compared with the cgroup's peak and the
// probe's tokens/s.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/configuration.h"
#include "plan/hardware.h"

namespace tandem::plan {

struct ValidationPoint {
  std::string strategy;  // the frontier's name (ddp, zero1, zero2, fsdp, fsdp-checkpoint, tp, fsdp+tp)
  std::string model;     // gpt-cpu-N
  int world = 0;
  double measured_bytes = 0, predicted_bytes = 0;
  double measured_tokens_per_s = 0, predicted_tokens_per_s = 0;
  double memory_error() const { return predicted_bytes / measured_bytes - 1; }
  double time_error() const { return measured_tokens_per_s / predicted_tokens_per_s - 1; }  // of the step time
};

/// How the frontier worker lays `strategy` out on `world` processes of `batch` sequences each
/// (bench/frontier_worker.cpp): every process a data-parallel rank, except tp (one group of all)
/// and fsdp+tp (pairs). Throws tandem::Error for a strategy it does not run.
Configuration frontier_configuration(const std::string& strategy, int world, int64_t batch);

/// Throws tandem::Error when `results` is not a memory-frontier run of Tandem's probes.
std::vector<ValidationPoint> validate_frontier(const nlohmann::json& results, const Profile& cpu);
/// The comparison as a table, and how many are within 10 % (memory) and 20 % (time).
std::string validation_table(const std::vector<ValidationPoint>& points);

/// A CPU profile measured on this machine: `base` with the matmul rate, the memory bandwidth and
/// the operator overhead that give the least squares of the relative step-time errors over the
/// DDP probes of `results` (a memory-frontier run with `ddp` among its strategies, one process per
/// core), and the runtime's own memory: the median, over the smallest member's probes, of what the
/// cgroup charged beyond the plan's state and activations. Throws tandem::Error naming what is missing.
Profile fit_cpu_profile(const nlohmann::json& results, Profile base);

}  // namespace tandem::plan
