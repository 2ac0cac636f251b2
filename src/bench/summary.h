#pragma once
// The comparison table: one row per (model, implementation, strategy, world), each figure the
// median over repeats with its min..max (Note [Metrics] in summary.cpp).
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/run_index.h"

namespace tandem::bench {

/// Median and range of one figure over the repeats; n == 0 when nothing was measured.
struct Stat {
  double median = NAN, min = NAN, max = NAN;
  int n = 0;
  bool empty() const { return n == 0; }
};

/// Median (the mean of the two middle values for an even count), min and max.
Stat stat_of(std::vector<double> values);

struct Row {
  std::string model, impl, strategy;
  std::string backend;       // multi-process: "gloo" | "mpi" (PyTorch: gloo); one process: ""
  int world = 1;
  int nodes = 1;             // the world spread over this many nodes (netns or real hosts)
  int64_t params = 0, grad_bytes = 0, batch_per_device = 0;
  int buckets = 0;
  Stat samples_per_s;        // whole job: batch_per_device * world / p50 step
  Stat samples_per_s_device; // per device
  Stat p50_ms, p95_ms;
  Stat scaling_efficiency;   // per-device throughput / the same implementation's single device
  Stat exposed_comm_ms;      // synced step - no_sync step (DDP and its wrapper); fsdp: the two below summed; tp: tp_comm_ms (+ FSDP's)
  Stat exposed_gather_ms, exposed_reduce_scatter_ms;  // fsdp, rank 0: host time blocked on them per step
  Stat forward_ms, backward_ms, optimizer_ms;          // rank 0's phases
  int tp_size = 0;           // tensor parallelism: ranks per TP group (0: none)
  Stat tp_comm_ms, tp_comm_MB, tp_collectives;         // its TP group's collectives per step, rank 0: time blocked, bytes, count
  std::string pp_schedule;   // pipeline parallelism: its schedule ("" none)
  int pp_microbatches = 0, pp_stages_per_rank = 0;
  double pp_bubble_theory = -1;  // (P - 1) / (v m + P - 1)
  std::vector<Stat> pp_bubble, pp_activation_MB;  // by rank: share of the step blocked, activations held (Note [Pipeline measurements])
  Stat sync_busbw_GBps;      // the gradient's all-reduce in DDP's buckets: bytes/t * 2(n-1)/n
  Stat compute_ms, other_ms; // step breakdown: one device's step, and what is neither it nor exposed comm
  Stat mem_primary_MB;       // peak memory of device 0 (DataParallel's primary replica; rank 0)
  Stat mem_others_MB;        // the largest peak among the other devices (empty at world 1)
  std::string mem_kind;
  Stat state_params_MB, state_grads_MB, state_optimizer_MB;  // accounted, the largest rank's (empty: not recorded)
  Stat transient_MB, two_units_MB;  // fsdp: what a step adds at most, its two largest units (the largest rank's)
  std::string peer_strategy; // the PyTorch row this one is compared with ("" when none)
  Stat vs_peer;              // Tandem samples/s / the peer's, within each repeat
};

/// Rows for the strategies with a row (strategies.h: Baseline, Compared, PeerOnly) of every
/// measured (model, impl, world, nodes, backend), Tandem's before PyTorch's, in the
/// configuration's model order and the strategy table's order.
std::vector<Row> summarize(const RunIndex& index);

/// The row of `impl` `strategy` at `world` on `nodes` for `model` on `backend` (""; Gloo for a
/// multi-process strategy), if measured.
const Row* find_row(const std::vector<Row>& rows, const std::string& model, const std::string& impl,
                    const std::string& strategy, int world, int nodes = 1, const std::string& backend = "");

/// One line of the "Gloo vs MPI" table: the same Tandem measurement on both CPU backends, and
/// PyTorch's counterpart on Gloo, each ratio taken within a repeat (Note [Backends] in plan.cpp).
struct BackendComparison {
  std::string model, strategy;  // a compared multi-process strategy, or the gradient's all-reduce alone
  int world = 2;
  Stat gloo_ms, mpi_ms;         // Tandem's step p50 (allreduce: the bucketed all-reduce's p50)
  Stat gloo_over_mpi;           // Gloo's time / MPI's: > 1 when MPI is faster
  std::string peer_strategy;    // PyTorch's counterpart ("" for allreduce)
  Stat peer_ms;                 // its step p50, on Gloo
  Stat peer_over_mpi, peer_over_gloo;  // PyTorch's time / Tandem's: Tandem's speed-up per step
};

/// Every (model, world, strategy) Tandem measured on both Gloo and MPI, in the table's order.
std::vector<BackendComparison> compare_backends(const RunIndex& index);

}  // namespace tandem::bench
