#include "bench/scaling.h"

#include <algorithm>
#include <functional>
#include <map>

#include "tandem/error.h"

namespace tandem::bench {

// Note [Projection from a run]
// The model needs, per model: one device's step without gradient sync (compute), its backward
// (the window communication can hide in), DDP's bucket sizes, and how much of that window the
// all-reduce really used (overlap). All four come from Tandem's own runs:
// - compute, backward: the DDP no-sync step at the calibration world, the smallest world above
//   one with both a synced and a no-sync DDP run on one node;
// - buckets: the synced run's record;
// - overlap and comm_scale: calibrate() at the calibration world, so the prediction there matches
//   by construction (flagged "calibration" in the table); every other world is a true prediction.
// The all-reduce scale carries to projected shapes only over measured links: on a preset link
// (nvlink, ib100, ...) the projection assumes that fabric's own all-reduce, unscaled.
// On CPU a "device" is a core: ranks beyond the cores share them, so compute is scaled by
// max(1, ranks * threads / cores) relative to the calibration world. Projected shapes assume a
// device per rank (no sharing): their compute is the calibration compute without that factor.

namespace {

struct Median {
  double operator()(std::vector<double> v) const {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
};

// The projection's CPU backend: the first of --backends (Gloo unless only MPI ran). Runs on
// another backend are left out, so that one model is fitted to one engine.
std::string projection_backend(const Results& results) {
  return results.config.backends.empty() ? "gloo" : results.config.backends.front();
}

// Tandem's timed runs of `strategy` on the projection's backend.
const ByRepeat& select(const RunIndex& index, const std::string& model, const std::string& strategy, int world,
                       int nodes) {
  return index.repeats(model, "tandem", strategy, world, nodes, projection_backend(index.results()));
}

double median_of(const ByRepeat& runs, double Run::*field) {
  std::vector<double> v;
  for (const auto& [repeat, r] : runs) v.push_back(r->*field);
  return Median()(v);
}

std::optional<Link> resolve_link(const std::string& spec, const Run* sweep, const char* which,
                                 std::vector<std::string>& notes) {
  if (spec != "measured") return parse_link(spec);
  if (!sweep) {
    notes.push_back(std::string("the ") + which + "-node link is 'measured' but this run has no sweep across " +
                    (std::string(which) == "inter" ? "nodes" : "one node's ranks") +
                    " (give --link-" + which + " nvlink|ib100|ALPHA_US:BUSBW_GBPS)");
    return std::nullopt;
  }
  Link link = fit_link(sweep->sweep, sweep->world);
  link.name = "measured";
  return link;
}

// One model's validation rows and projections (Note [Projection from a run]).
void project_model(const RunIndex& index, const std::string& model, const std::function<double(int)>& sharing,
                   Scaling& out) {
  const Results& results = index.results();
  const CommFigures& ddp = lookup_strategy("ddp").comm;  // the model is DDP's (its buckets, its overlap)
  int calibration_world = 0;
  for (int w : results.config.worlds) {
    if (w > 1 && !calibration_world && !select(index, model, ddp.synced, w, 1).empty() &&
        !select(index, model, ddp.no_sync, w, 1).empty()) {
      calibration_world = w;
    }
  }
  if (!calibration_world) {
    out.notes.push_back(model + ": no synced and no-sync DDP pair on one node to calibrate from");
    return;
  }
  const auto& synced = select(index, model, ddp.synced, calibration_world, 1);
  const auto& no_sync = select(index, model, ddp.no_sync, calibration_world, 1);
  StepProfile base;
  base.compute_s = median_of(no_sync, &Run::p50_s) / sharing(calibration_world);  // one unshared device
  base.backward_s = median_of(no_sync, &Run::backward_s) / sharing(calibration_world);
  const Run& shape = *synced.begin()->second;
  base.bucket_bytes = shape.bucket_bytes;
  if (base.bucket_bytes.empty() && shape.buckets > 0) {  // older records: equal buckets
    base.bucket_bytes.assign(static_cast<size_t>(shape.buckets), shape.grad_bytes / shape.buckets);
  }
  if (base.bucket_bytes.empty()) base.bucket_bytes.push_back(shape.grad_bytes);
  if (!out.intra) return;
  const Link inter = out.inter.value_or(Link{"unset", 0, 1});
  auto at_world = [&](int world, int nodes) {
    StepProfile p = base;
    const double share = sharing(world / nodes);
    p.compute_s *= share;
    p.backward_s *= share;
    return p;
  };
  StepProfile calibrated = at_world(calibration_world, 1);
  const auto fit = calibrate(calibrated, median_of(synced, &Run::p50_s), calibration_world, 1, *out.intra, inter);
  base.overlap = fit.overlap;
  base.comm_scale = fit.comm_scale;
  // Validation: every world this run measured, one node and (netns runs) several.
  std::map<std::pair<int, int>, double> measured;
  const auto& singles = select(index, model, baseline().name, 1, 1);
  if (!singles.empty()) measured[{1, 1}] = median_of(singles, &Run::p50_s);
  for (const auto& [world, nodes] : index.shapes(model, "tandem", ddp.synced, projection_backend(results))) {
    measured[{world, nodes}] = median_of(select(index, model, ddp.synced, world, nodes), &Run::p50_s);
  }
  for (const auto& [key, seconds] : measured) {
    const auto [world, nodes] = key;
    if ((nodes > 1 && !out.inter) || seconds <= 0) continue;
    StepProfile p = at_world(world, nodes);
    p.overlap = base.overlap;
    p.comm_scale = base.comm_scale;
    ValidationRow v;
    v.model = model;
    v.world = world;
    v.nodes = nodes;
    v.measured_s = seconds;
    v.predicted_s = predict(p, world / nodes, nodes, *out.intra, inter).step_s;
    v.calibration = world == calibration_world && nodes == 1;
    out.validation.push_back(v);
  }
  for (const auto& spec : results.config.project) {
    const auto [devices, nodes] = parse_shape(spec);
    if (nodes > 1 && !out.inter) continue;
    // The all-reduce scale is this machine's (its cores' contention, its ranks' skew): it
    // carries to a shape only over links measured here, not to a preset's fabric.
    StepProfile target = base;
    const bool measured_links = out.intra->name == "measured" && (nodes == 1 || inter.name == "measured");
    if (!measured_links) target.comm_scale = 1.0;
    ProjectionRow row;
    row.model = model;
    row.compute_s = target.compute_s;
    row.backward_s = target.backward_s;
    row.overlap = target.overlap;
    row.comm_scale = target.comm_scale;
    row.prediction = predict(target, devices, nodes, *out.intra, inter, Algorithm::Ring);
    row.tree_prediction = predict(target, devices, nodes, *out.intra, inter, Algorithm::Tree);
    out.projections.push_back(row);
  }
}

}  // namespace

Scaling project_run(const RunIndex& index) {
  const Results& results = index.results();
  Scaling out;
  // One node's sweep fits the intra-node link, a sweep across nodes the inter-node one.
  const Run* sweep = nullptr;
  const Run* sweep_across = nullptr;
  // Several sweeps (--sweep: every world, every backend): the projection's backend, and on one
  // node the smallest world, the one DDP is calibrated at (Note [Projection from a run]).
  for (const Run* r : index.sweeps()) {
    if (normal_backend(r->strategy, r->backend) != normal_backend(r->strategy, projection_backend(results))) continue;
    if (r->nodes > 1) {
      sweep_across = r;
    } else if (!sweep || r->world < sweep->world) {
      sweep = r;
    }
  }
  const bool any_multinode = *index.node_counts().rbegin() > 1;
  if (results.config.project.empty() && !sweep && !sweep_across) return out;
  if (const Run* shown = sweep_across ? sweep_across : sweep) {
    out.sweep = shown->sweep;
    out.sweep_world = shown->world;
    out.sweep_nodes = shown->nodes;
  }
  try {
    out.intra = resolve_link(results.config.link_intra, sweep, "intra", out.notes);
    out.inter = resolve_link(results.config.link_inter, sweep_across, "inter", out.notes);
  } catch (const Error& e) {
    out.notes.push_back(std::string("no projection: ") + e.what());
    return out;
  }
  // A one-node run needs no inter-node link; an unset one only blocks shapes with several nodes.
  const double cores = results.machine.value("cores", 0.0);
  const int threads = std::max(1, results.config.threads);
  const bool cpu = results.config.device == "cpu";
  auto sharing = [&](int ranks_per_node) {
    return cpu && cores > 0 ? std::max(1.0, ranks_per_node * threads / cores) : 1.0;
  };
  for (const auto& model : results.config.models) {
    try {
      project_model(index, model, sharing, out);
    } catch (const Error& e) {  // a broken record costs this model its projection, not the report
      out.notes.push_back(model + ": no projection: " + e.what());
    }
  }
  if (any_multinode && !out.inter) out.notes.push_back("runs across nodes are not validated without an inter-node link");
  return out;
}

}  // namespace tandem::bench
