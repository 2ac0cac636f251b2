#include "bench/analysis.h"

#include <algorithm>

namespace tandem::bench {

using nlohmann::json;

namespace {

json stat_json(const Stat& s) {
  if (s.empty()) return nullptr;
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"n", s.n}};
}

json link_json(const std::optional<Link>& link) {
  if (!link) return nullptr;
  return {{"name", link->name}, {"alpha_s", link->alpha_s}, {"busbw_Bps", link->busbw_Bps}};
}

}  // namespace

Analysis analyze(const Results& results) {
  const RunIndex index(results);
  Analysis a;
  a.rows = summarize(index);
  a.recommendations = recommend(a.rows, results.config.models);
  a.scaling = project_run(index);
  a.backends = compare_backends(index);
  for (const Run* r : index.sweeps()) {
    if (r->nodes == 1) a.sweeps.push_back(*r);
  }
  std::stable_sort(a.sweeps.begin(), a.sweeps.end(), [](const Run& x, const Run& y) {
    return x.world != y.world ? x.world < y.world : x.backend < y.backend;
  });
  for (const Run* r : index.unsupported()) a.not_measured.push_back(*r);
  const auto& backends = results.config.backends;
  a.names_backends = index.has_backend("mpi") || std::find(backends.begin(), backends.end(), "mpi") != backends.end();
  a.torch_version = index.torch_version();
  return a;
}

json to_json(const Analysis& a) {
  json rows = json::array();
  for (const auto& r : a.rows) {
    rows.push_back({{"model", r.model}, {"impl", r.impl}, {"strategy", r.strategy}, {"backend", r.backend},
                    {"world", r.world},
                    {"params", r.params}, {"grad_bytes", r.grad_bytes}, {"buckets", r.buckets},
                    {"batch_per_device", r.batch_per_device}, {"samples_per_s", stat_json(r.samples_per_s)},
                    {"samples_per_s_device", stat_json(r.samples_per_s_device)}, {"p50_ms", stat_json(r.p50_ms)},
                    {"p95_ms", stat_json(r.p95_ms)}, {"scaling_efficiency", stat_json(r.scaling_efficiency)},
                    {"exposed_comm_ms", stat_json(r.exposed_comm_ms)},
                    {"sync_busbw_GBps", stat_json(r.sync_busbw_GBps)}, {"compute_ms", stat_json(r.compute_ms)},
                    {"other_ms", stat_json(r.other_ms)}, {"mem_primary_MiB", stat_json(r.mem_primary_MB)},
                    {"mem_others_MiB", stat_json(r.mem_others_MB)}, {"mem_kind", r.mem_kind},
                    {"peer_strategy", r.peer_strategy}, {"vs_peer", stat_json(r.vs_peer)}});
    json& row = rows.back();
    if (!r.state_params_MB.empty()) {  // only where recorded: older results read back unchanged
      row["model_state_MiB"] = {{"params", stat_json(r.state_params_MB)},
                                {"grads", stat_json(r.state_grads_MB)},
                                {"optimizer", stat_json(r.state_optimizer_MB)}};
    }
  }
  json recs = json::array();
  for (const auto& r : a.recommendations) {
    recs.push_back({{"model", r.model}, {"strategy", r.strategy}, {"backend", r.backend}, {"world", r.world},
                    {"why", r.why}});
  }
  json backends = json::array();
  for (const auto& c : a.backends) {
    backends.push_back({{"model", c.model}, {"strategy", c.strategy}, {"world", c.world},
                        {"gloo_ms", stat_json(c.gloo_ms)}, {"mpi_ms", stat_json(c.mpi_ms)},
                        {"gloo_over_mpi", stat_json(c.gloo_over_mpi)}, {"peer_strategy", c.peer_strategy},
                        {"peer_ms", stat_json(c.peer_ms)}, {"peer_over_mpi", stat_json(c.peer_over_mpi)},
                        {"peer_over_gloo", stat_json(c.peer_over_gloo)}});
  }
  const auto& s = a.scaling;
  json sweep = json::array();
  for (const auto& p : s.sweep) sweep.push_back({{"bytes", p.bytes}, {"p50_s", p.seconds}});
  json projections = json::array();
  for (const auto& p : s.projections) {
    projections.push_back({{"model", p.model}, {"devices_per_node", p.prediction.devices_per_node},
                           {"nodes", p.prediction.nodes}, {"compute_s", p.compute_s}, {"backward_s", p.backward_s},
                           {"overlap", p.overlap}, {"comm_scale", p.comm_scale}, {"comm_s", p.prediction.comm_s},
                           {"exposed_comm_s", p.prediction.exposed_comm_s}, {"step_s", p.prediction.step_s},
                           {"efficiency", p.prediction.efficiency}, {"tree_step_s", p.tree_prediction.step_s},
                           {"tree_efficiency", p.tree_prediction.efficiency}});
  }
  json validation = json::array();
  for (const auto& v : s.validation) {
    validation.push_back({{"model", v.model}, {"world", v.world}, {"nodes", v.nodes}, {"measured_s", v.measured_s},
                          {"predicted_s", v.predicted_s}, {"error", v.error()}, {"calibration", v.calibration}});
  }
  return {{"rows", rows},
          {"recommendations", recs},
          {"links", {{"intra", link_json(s.intra)}, {"inter", link_json(s.inter)}, {"sweep_world", s.sweep_world},
                     {"sweep_nodes", s.sweep_nodes}, {"sweep", sweep}}},
          {"projections", projections},
          {"validation", validation},
          {"notes", s.notes},
          {"backend_comparison", backends}};
}

}  // namespace tandem::bench
