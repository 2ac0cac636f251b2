#include "bench/projection.h"

// Note [Projection]
// Model. The alpha-beta cost of all-reduce from Thakur, Rabenseifner & Gropp, "Optimization of
// Collective Communication Operations in MPICH" (IJHPCA 2005), with the gamma (reduction
// arithmetic) term omitted, written with the bus bandwidth of NCCL-tests' doc/PERFORMANCE.md
// (busbw = algbw * 2(p-1)/p for all-reduce, algbw = bytes/seconds), so that beta = 1/busbw needs
// no per-algorithm factor:
//   ring:               2(p-1) alpha + 2(p-1)/p * bytes/busbw
//   halving-doubling:   2 ceil(log2 p) alpha + 2(p-1)/p * bytes/busbw   (Algorithm::Tree)
//   one rank:           0
// For p not a power of two, Thakur's halving-doubling first folds the extra ranks into the
// nearest lower power of two and unfolds them at the end; we ignore that cost and take the
// power-of-two formula at ceil(log2 p) steps.
// Hierarchy (d devices per node, n nodes): a ring reduce-scatter inside each node
// ((d-1) alpha + (d-1)/d * bytes/busbw, NCCL-tests' reduce-scatter busbw), an all-reduce of the
// bytes/d shard between nodes (ring or halving-doubling over n ranks on the inter link), and a
// ring all-gather inside the node (the same cost as the reduce-scatter). The two intra stages sum
// to the intra-node ring all-reduce. The d shard all-reduces run at once, one per local rank:
// the inter link's busbw is per device (a rail-optimized node, one NIC per device); for one NIC
// shared by d devices give busbw/d.
// Overlap. DDP launches bucket all-reduces during backward, back to back in launch order:
//   comm    = comm_scale * sum over buckets of allreduce(bucket)
//   exposed = max(comm_scale * allreduce(last bucket), comm - overlap * backward)
//   step    = compute + exposed,   efficiency = compute / step   (weak scaling)
// The last bucket is ready only when backward ends, so it never hides; `overlap` is the fraction
// of backward that hides communication, nominally 1, calibrated from a measured synced step by
// calibrate_overlap (the inverse of the formula above, clamped to [0, 1]). Where no overlap in
// [0, 1] explains the measured step -- on 2 CPU cores a step's all-reduce took 2-3x the sweep's,
// competing with compute and waiting for the slower rank -- calibrate() also fits comm_scale,
// the in-step all-reduce time over the link model's, and carries it to the other world sizes.
// Ignored: compute and communication contending for the CPU (Gloo) or SMs and memory (NCCL)
// beyond what comm_scale absorbs at the calibration world; NCCL's protocol switch (LL / LL128 / Simple) and
// algorithm choice by size, so alpha and busbw are one pair over all sizes; congestion and
// oversubscribed fabrics; stragglers and the gradient copies in and out of buckets.

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "tandem/error.h"

namespace tandem::bench {
namespace {

constexpr double kUs = 1e-6;
constexpr double kGBps = 1e9;  // bytes/s; GB is 10^9 bytes, as NCCL-tests reports

// Link presets: nominal figures for when nothing was measured. The fit of a sweep measured on the
// machine itself (fit_link) is preferred to any of these.
// - nvlink: 370 GB/s all-reduce busbw, the H100/H200 NVLink 4 class figure of our issue. alpha
//   3 us: NCCL's tuning model (src/graph/tuning.cc, hwLat) charges an NVLink ring step 0.6 us
//   (LL) to 3.4 us (Simple).
// - ib100 / ib400: 100 / 400 Gb/s InfiniBand, a line rate of 12.5 / 50 GB/s after encoding;
//   busbw cannot exceed it, and transport headers take a few percent: 12 / 48 GB/s. alpha 5 us:
//   NCCL's tuning model charges a network ring step 2.7 us (LL) to 14 us (Simple).
// - eth10 / eth100: 10 / 100 Gb/s Ethernet under TCP (Gloo): 1.25 / 12.5 GB/s line rate times
//   1448/1538, the TCP payload of a 1500-byte-MTU frame on the wire (with timestamps): 1.17 /
//   11.7 GB/s. alpha 25 us, a nominal kernel TCP stack figure, not measured here.
struct Preset {
  const char* name;
  double alpha_us;
  double busbw_GBps;
};
constexpr Preset kPresets[] = {
    {"nvlink", 3.0, 370.0}, {"ib100", 5.0, 12.0},  {"ib400", 5.0, 48.0},
    {"eth10", 25.0, 1.17},  {"eth100", 25.0, 11.7},
};

[[noreturn]] void bad_link(const std::string& spec) {
  throw Error("link '" + spec +
              "' is not valid: expected nvlink, ib100, ib400, eth10, eth100 or ALPHA_US:BUSBW_GBPS (e.g. 5:12.5)");
}

// A whole decimal number, nothing before or after it ("inf", "nan", " 5" and "5x" are not).
bool parse_number(const std::string& text, double& value) {
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.')) return false;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(value);
}

int ceil_log2(int p) {
  int steps = 0;
  while ((int64_t{1} << steps) < p) ++steps;
  return steps;
}

void check_link(const Link& link) {
  TANDEM_CHECK(std::isfinite(link.alpha_s) && link.alpha_s >= 0, "link '", link.name, "': alpha ",
               link.alpha_s, " s is not valid: expected a finite number >= 0");
  TANDEM_CHECK(std::isfinite(link.busbw_Bps) && link.busbw_Bps > 0, "link '", link.name, "': bus bandwidth ",
               link.busbw_Bps, " B/s is not valid: expected a finite number > 0");
}

// allreduce_seconds with fractional bytes: the hierarchy's shard, bytes/d, need not be whole.
double allreduce(Algorithm algorithm, double bytes, int ranks, const Link& link) {
  TANDEM_CHECK(ranks >= 1, "all-reduce over ", ranks, " ranks: expected at least 1");
  TANDEM_CHECK(bytes >= 0, "all-reduce of ", bytes, " bytes: expected at least 0");
  if (ranks == 1) return 0;
  check_link(link);
  const double p = ranks;
  const double steps = algorithm == Algorithm::Ring ? 2 * (p - 1) : 2.0 * ceil_log2(ranks);
  return steps * link.alpha_s + 2 * (p - 1) / p * bytes / link.busbw_Bps;
}

void check_shape(int devices_per_node, int nodes) {
  TANDEM_CHECK(devices_per_node >= 1, "devices per node ", devices_per_node, ": expected at least 1");
  TANDEM_CHECK(nodes >= 1, "nodes ", nodes, ": expected at least 1");
}

double hierarchical(Algorithm algorithm, double bytes, int devices_per_node, int nodes, const Link& intra,
                    const Link& inter) {
  check_shape(devices_per_node, nodes);
  // Reduce-scatter plus all-gather inside the node is the intra ring all-reduce.
  return allreduce(Algorithm::Ring, bytes, devices_per_node, intra) +
         allreduce(algorithm, bytes / devices_per_node, nodes, inter);
}

void check_profile(const StepProfile& profile, int devices_per_node, int nodes) {
  check_shape(devices_per_node, nodes);
  TANDEM_CHECK(std::isfinite(profile.compute_s) && profile.compute_s > 0, "step profile: compute ",
               profile.compute_s, " s is not valid: expected a finite time > 0");
  TANDEM_CHECK(std::isfinite(profile.backward_s) && profile.backward_s >= 0, "step profile: backward ",
               profile.backward_s, " s is not valid: expected a finite time >= 0");
  TANDEM_CHECK(profile.overlap >= 0 && profile.overlap <= 1, "step profile: overlap ", profile.overlap,
               " is not valid: expected a fraction in [0, 1]");
  for (int64_t b : profile.bucket_bytes) TANDEM_CHECK(b >= 0, "step profile: a bucket of ", b, " bytes");
}

// comm (all buckets back to back) and the last bucket's all-reduce.
std::pair<double, double> bucket_seconds(const StepProfile& profile, int devices_per_node, int nodes,
                                         const Link& intra, const Link& inter, Algorithm algorithm) {
  double comm = 0, last = 0;
  for (int64_t b : profile.bucket_bytes) {
    last = hierarchical(algorithm, static_cast<double>(b), devices_per_node, nodes, intra, inter);
    comm += last;
  }
  return {comm, last};
}

}  // namespace

Link parse_link(const std::string& spec) {
  for (const Preset& preset : kPresets) {
    if (spec == preset.name) return Link{preset.name, preset.alpha_us * kUs, preset.busbw_GBps * kGBps};
  }
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) bad_link(spec);
  double alpha_us = 0, busbw_GBps = 0;
  if (!parse_number(spec.substr(0, colon), alpha_us) || !parse_number(spec.substr(colon + 1), busbw_GBps) ||
      busbw_GBps <= 0) {
    bad_link(spec);
  }
  return Link{spec, alpha_us * kUs, busbw_GBps * kGBps};
}

double allreduce_seconds(Algorithm algorithm, int64_t bytes, int ranks, const Link& link) {
  return allreduce(algorithm, static_cast<double>(bytes), ranks, link);
}

double allreduce_seconds(Algorithm algorithm, int64_t bytes, int devices_per_node, int nodes, const Link& intra,
                         const Link& inter) {
  return hierarchical(algorithm, static_cast<double>(bytes), devices_per_node, nodes, intra, inter);
}

// Least squares of seconds = a + b * bytes, weighted by 1/seconds^2: the sweep spans 4 KiB to
// 64 MiB, four orders of magnitude in time, and an unweighted fit lets the largest messages decide
// the intercept (alpha came out anywhere between 0 and 3.5 ms on the same link). Weighting by
// relative error makes each size count alike: small sizes fix alpha, large ones busbw. The ring
// formula makes a = 2(p-1) alpha and b = 2(p-1)/p / busbw. A negative a (noise at small sizes)
// is read as alpha = 0; b <= 0 means time did not grow with size: no bandwidth was measured.
Link fit_link(const std::vector<SweepPoint>& sweep, int ranks) {
  TANDEM_CHECK(ranks >= 2, "fitting a link to a sweep over ", ranks, " ranks: expected at least 2");
  TANDEM_CHECK(!sweep.empty(), "fitting a link: the sweep is empty; expected at least two sizes");
  double w_sum = 0, x_sum = 0, y_sum = 0;
  for (const SweepPoint& point : sweep) {
    TANDEM_CHECK(point.bytes >= 0, "fitting a link: a sweep point of ", point.bytes, " bytes");
    TANDEM_CHECK(std::isfinite(point.seconds) && point.seconds >= 0, "fitting a link: a sweep point of ",
                 point.seconds, " s at ", point.bytes, " bytes; expected a finite time >= 0");
    const double w = 1.0 / std::pow(std::max(point.seconds, 1e-9), 2);
    w_sum += w;
    x_sum += w * static_cast<double>(point.bytes);
    y_sum += w * point.seconds;
  }
  const double mean_x = x_sum / w_sum, mean_y = y_sum / w_sum;  // weighted means; centred sums below
  double sxx = 0, sxy = 0;
  for (const SweepPoint& point : sweep) {
    const double w = 1.0 / std::pow(std::max(point.seconds, 1e-9), 2);
    const double dx = static_cast<double>(point.bytes) - mean_x;
    sxx += w * dx * dx;
    sxy += w * dx * (point.seconds - mean_y);
  }
  TANDEM_CHECK(sxx > 0, "fitting a link: the sweep has one message size; expected at least two distinct sizes");
  const double b = sxy / sxx;
  const double a = mean_y - b * mean_x;
  TANDEM_CHECK(b > 0, "fitting a link: all-reduce time does not grow with size (slope ", b,
               " s/byte), so the sweep measured no bandwidth; sweep larger sizes");
  const double p = ranks;
  return Link{"measured", std::max(a, 0.0) / (2 * (p - 1)), 2 * (p - 1) / p / b};
}

Prediction predict(const StepProfile& profile, int devices_per_node, int nodes, const Link& intra,
                   const Link& inter, Algorithm algorithm) {
  check_profile(profile, devices_per_node, nodes);
  auto [comm, last] = bucket_seconds(profile, devices_per_node, nodes, intra, inter, algorithm);
  comm *= profile.comm_scale;
  last *= profile.comm_scale;
  Prediction prediction;
  prediction.devices_per_node = devices_per_node;
  prediction.nodes = nodes;
  prediction.comm_s = comm;
  prediction.exposed_comm_s = std::max(last, comm - profile.overlap * profile.backward_s);
  prediction.step_s = profile.compute_s + prediction.exposed_comm_s;
  prediction.efficiency = profile.compute_s / prediction.step_s;
  return prediction;
}

// With no backward there is nothing for communication to hide behind, and predict() does not
// depend on the overlap: 0.
double calibrate_overlap(const StepProfile& profile, double measured_step_s, int devices_per_node, int nodes,
                         const Link& intra, const Link& inter, Algorithm algorithm) {
  check_profile(profile, devices_per_node, nodes);
  TANDEM_CHECK(std::isfinite(measured_step_s) && measured_step_s > 0, "calibrating the overlap: measured step ",
               measured_step_s, " s is not valid: expected a finite time > 0");
  const double comm = bucket_seconds(profile, devices_per_node, nodes, intra, inter, algorithm).first;
  if (profile.backward_s <= 0) return 0;
  const double overlap = (comm - (measured_step_s - profile.compute_s)) / profile.backward_s;
  return std::clamp(overlap, 0.0, 1.0);
}

// exposed(k) = max(k * last, k * comm - overlap * backward) grows with k, so the k that meets
// the measured exposure is whichever branch's solution is consistent with the other.
Calibration calibrate(const StepProfile& profile, double measured_step_s, int devices_per_node, int nodes,
                      const Link& intra, const Link& inter, Algorithm algorithm) {
  StepProfile unscaled = profile;
  unscaled.comm_scale = 1.0;
  Calibration c;
  c.overlap = calibrate_overlap(unscaled, measured_step_s, devices_per_node, nodes, intra, inter, algorithm);
  const double exposed = measured_step_s - profile.compute_s;
  const auto [comm, last] = bucket_seconds(unscaled, devices_per_node, nodes, intra, inter, algorithm);
  if (exposed <= 0 || comm <= 0) return c;
  const double hidden = c.overlap * profile.backward_s;
  const double by_last = last > 0 ? exposed / last : 0;  // the last bucket decides
  const double by_total = (exposed + hidden) / comm;      // all buckets minus what backward hides
  if (last > 0 && by_last * comm - hidden <= exposed * (1 + 1e-12)) {
    c.comm_scale = by_last;
  } else {
    c.comm_scale = by_total;
  }
  return c;
}

std::pair<int, int> parse_shape(const std::string& spec) {
  auto bad = [&] {
    throw Error("shape '" + spec +
                "' is not valid: expected DEVICESxNODES (e.g. 8x4) or DEVICES (one node), positive whole numbers");
  };
  auto whole = [&](const std::string& text) {
    if (text.empty() || text.size() > 6) bad();
    for (char c : text) {
      if (c < '0' || c > '9') bad();
    }
    const int n = std::atoi(text.c_str());
    if (n < 1) bad();
    return n;
  };
  const size_t x = spec.find('x');
  if (x == std::string::npos) return {whole(spec), 1};
  return {whole(spec.substr(0, x)), whole(spec.substr(x + 1))};
}

}  // namespace tandem::bench
