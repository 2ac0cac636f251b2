#pragma once
// The scaling projection of `tandem bench --project`: an alpha-beta model of all-reduce (Note
// [Projection] in projection.cpp) applied to a step's measured compute time and gradient bytes.
// Pure arithmetic: no process, no clock; LibTorch-free.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::bench {

/// A link in the alpha-beta model: `alpha_s` seconds of latency per communication step, and the
/// bus bandwidth in bytes/s (NCCL-tests' busbw: for all-reduce, algbw * 2(p-1)/p).
struct Link {
  std::string name;      // "measured", "nvlink", "ib100", or the spec the user gave
  double alpha_s = 0;
  double busbw_Bps = 0;
};

/// "nvlink" (370 GB/s bus bandwidth), "ib100" (100 Gb/s InfiniBand), "ib400", "eth10", "eth100",
/// or "ALPHA_US:BUSBW_GBPS" (e.g. "5:12.5"). Throws tandem::Error naming the accepted forms.
Link parse_link(const std::string& spec);

enum class Algorithm { Ring, Tree };

/// Seconds to all-reduce `bytes` over `ranks` ranks on one link.
/// Ring: 2(p-1) alpha + 2(p-1)/p * bytes/busbw. Tree (Rabenseifner halving-doubling):
/// 2 ceil(log2 p) alpha + 2(p-1)/p * bytes/busbw. One rank: 0.
double allreduce_seconds(Algorithm algorithm, int64_t bytes, int ranks, const Link& link);

/// Hierarchical all-reduce over `nodes` nodes of `devices_per_node` devices each: reduce-scatter
/// and all-gather inside each node (ring on `intra`) around an all-reduce of bytes/devices_per_node
/// between nodes (`algorithm` on `inter`). One node: the intra-node all-reduce alone.
double allreduce_seconds(Algorithm algorithm, int64_t bytes, int devices_per_node, int nodes,
                         const Link& intra, const Link& inter);

/// One all-reduce measurement of a sweep.
struct SweepPoint {
  int64_t bytes = 0;
  double seconds = 0;
};

/// Fits alpha and busbw to a sweep measured over `ranks` ranks with the ring formula (least
/// squares of seconds = a + b*bytes). Throws when fewer than two distinct sizes or ranks < 2.
Link fit_link(const std::vector<SweepPoint>& sweep, int ranks);

/// What one step is made of, measured at one device.
struct StepProfile {
  double compute_s = 0;       // a step with no gradient synchronization (one device's work)
  double backward_s = 0;      // its backward pass: the window communication can overlap with
  std::vector<int64_t> bucket_bytes;  // DDP's buckets, in launch order (the last one cannot overlap)
  double overlap = 1.0;       // the fraction of backward_s that hides communication, in [0, 1]
  double comm_scale = 1.0;    // in-step all-reduce time / the link model's (ranks contending for
                              // cores, waiting for the slowest rank): calibrated, 1 by default
};

struct Prediction {
  int devices_per_node = 1, nodes = 1;
  double comm_s = 0;          // all buckets' all-reduce, back to back
  double exposed_comm_s = 0;  // what the step waits for beyond compute
  double step_s = 0;          // compute + exposed communication
  double efficiency = 1.0;    // compute_s / step_s (weak scaling: the per-device batch is fixed)
};

/// comm = comm_scale * (all buckets' all-reduce); exposed = max(last bucket, comm - overlap *
/// backward); step = compute + exposed.
Prediction predict(const StepProfile& profile, int devices_per_node, int nodes, const Link& intra,
                   const Link& inter, Algorithm algorithm = Algorithm::Ring);

/// The overlap fraction that makes predict() reproduce a measured synced step at one world size
/// (calibration): clamp((comm - (measured_step - compute)) / backward, 0, 1).
double calibrate_overlap(const StepProfile& profile, double measured_step_s, int devices_per_node, int nodes,
                         const Link& intra, const Link& inter, Algorithm algorithm = Algorithm::Ring);

/// What calibrate() fits at one measured world size.
struct Calibration {
  double overlap = 1.0;
  double comm_scale = 1.0;
};

/// Fits the overlap fraction (calibrate_overlap) and, where no overlap in [0, 1] reproduces the
/// measured step, the communication scale too, so that predict() matches the measured step
/// exactly: a step that waits longer than the link model's all-reduce (contention, the slowest
/// rank) gets comm_scale > 1, one that waits less gets comm_scale < 1. A measured step at or
/// below compute leaves comm_scale at 1 (nothing to calibrate).
Calibration calibrate(const StepProfile& profile, double measured_step_s, int devices_per_node, int nodes,
                      const Link& intra, const Link& inter, Algorithm algorithm = Algorithm::Ring);

/// "4x2" (4 devices per node, 2 nodes) or "8" (one node); throws on anything else.
std::pair<int, int> parse_shape(const std::string& spec);

}  // namespace tandem::bench
