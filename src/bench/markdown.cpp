#include "bench/markdown.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

namespace tandem::bench {

namespace {

std::string num(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// "1234 (1201..1260)", or "–" when nothing was measured.
std::string cell(const Stat& s, int digits) {
  if (s.empty()) return "–";
  if (s.n == 1) return num(s.median, digits);
  return num(s.median, digits) + " (" + num(s.min, digits) + "..." + num(s.max, digits) + ")";
}

std::string median(const Stat& s, int digits) { return s.empty() ? "–" : num(s.median, digits); }

std::string params_text(int64_t params) {
  return params >= 1000000 ? num(params / 1e6, 2) + " M" : num(params / 1e3, 0) + " k";
}

std::string label(const Row& r) {
  if (r.impl == "tandem") return r.strategy == "accelerate" ? "Tandem Accelerator" : "Tandem " + r.strategy;
  if (r.strategy == "accelerate") return "HF accelerate";
  if (r.strategy == "dp") return "torch.nn.DataParallel";
  return "PyTorch " + r.strategy;
}

// The validation's error; a calibration row matches by construction unless the overlap fraction
// had to be clamped to [0, 1], and then says by how much it misses.
std::string error_cell(const ValidationRow& v) {
  const std::string error = num(v.error() * 100, 1) + " %";
  if (!v.calibration) return error;
  return std::abs(v.error()) < 0.005 ? "calibration" : "calibration, misses by " + error + " (overlap clamped)";
}

// "1 device", "2 devices"; for a row, "2 devices on 2 nodes".
std::string device_count(int world) { return std::to_string(world) + (world == 1 ? " device" : " devices"); }
std::string device_count(const Row& r) {
  return device_count(r.world) + (r.nodes > 1 ? " on " + std::to_string(r.nodes) + " nodes" : "");
}

// "2", or "2 (2 nodes)" for a world spread over nodes.
std::string devices(const Row& r) {
  return std::to_string(r.world) + (r.nodes > 1 ? " (" + std::to_string(r.nodes) + " nodes)" : "");
}

std::string describe_machine(const Results& results) {
  const auto& m = results.machine;
  std::string text = m.value("cpu", std::string("unknown CPU"));
  text += ", " + std::to_string(m.value("cores", 0)) + " cores";
  if (m.contains("memory_gib")) text += ", " + num(m.value("memory_gib", 0.0), 0) + " GiB";
  text += ", " + std::to_string(m.value("gpus", 0)) + " GPU(s)";
  if (m.contains("kernel")) text += ", " + m.value("kernel", std::string());
  return text;
}

std::string torch_version(const Results& results) {
  for (const auto& r : results.runs) {
    if (r.versions.contains("torch")) return r.versions.value("torch", std::string());
  }
  return "";
}

}  // namespace

std::string render_markdown(const Results& results, const Analysis& analysis) {
  const auto& c = results.config;
  std::ostringstream md;
  md << "# tandem bench: " << results.created_utc << "\n\n";
  md << "- Machine: " << describe_machine(results) << "\n";
  md << "- Tandem " << results.tandem_version;
  if (auto t = torch_version(results); !t.empty()) md << ", LibTorch/PyTorch " << t;
  md << "; device " << c.device << ", precision " << c.precision << ", " << c.threads
     << " intra-op thread(s) per process, model presets '" << c.scale << "'\n";
  md << "- " << c.repeats << " repeats (interleaved), " << c.steps << " timed steps after " << c.warmup
     << " warm-up steps per measurement; figures are medians over repeats (min...max)\n";
  if (!results.command.empty()) md << "- Command: `" << results.command << "`\n";
  if (!results.peers_note.empty()) md << "- PyTorch peers: " << results.peers_note << "\n";
  md << "\n## Performance across model sizes\n\n";
  md << "| model | strategy | devices | samples/s | per device | p50 step ms | p95 step ms | scaling eff. "
        "| peak MiB device 0 | peak MiB others | exposed comm ms | sync busbw GB/s | ÷ PyTorch peer |\n";
  md << "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& model : c.models) {
    bool first = true;
    for (const auto& r : analysis.rows) {
      if (r.model != model) continue;
      std::string name = first ? model + " (" + params_text(r.params) + " params, batch " +
                                     std::to_string(r.batch_per_device) + "/device)"
                               : "";
      first = false;
      std::string peer = r.vs_peer.empty() ? "–" : cell(r.vs_peer, 2) + " vs " + r.peer_strategy;
      md << "| " << name << " | " << label(r) << " | " << devices(r) << " | " << cell(r.samples_per_s, 0) << " | "
         << median(r.samples_per_s_device, 0) << " | " << cell(r.p50_ms, 1) << " | " << median(r.p95_ms, 1) << " | "
         << median(r.scaling_efficiency, 2) << " | " << median(r.mem_primary_MB, 0) << " | "
         << median(r.mem_others_MB, 0) << " | " << median(r.exposed_comm_ms, 1) << " | "
         << median(r.sync_busbw_GBps, 2) << " | " << peer << " |\n";
    }
  }
  md << "\nGradient: ";
  std::set<std::string> seen;
  for (const auto& r : analysis.rows) {
    if (r.impl != "tandem" || r.strategy != "ddp" || !seen.insert(r.model).second) continue;
    md << (seen.size() > 1 ? "; " : "") << r.model << " " << num(r.grad_bytes / 1e6, 2) << " MB in " << r.buckets
       << " bucket(s)";
  }
  md << ". Memory is " << (c.device == "cpu" ? "each rank's peak RSS (DataParallel: each replica's accounted bytes)"
                                              : "each device's peak CUDA allocation")
     << ".\n";

  md << "\n## Where the step goes (ms, medians)\n\n";
  md << "| model | strategy | devices | step | compute (one device) | exposed comm | other |\n|---|---|---|---|---|---|---|\n";
  for (const auto& r : analysis.rows) {
    if (r.impl != "tandem" || r.strategy == "single") continue;
    md << "| " << r.model << " | " << label(r) << " | " << devices(r) << " | " << median(r.p50_ms, 1) << " | "
       << median(r.compute_ms, 1) << " | " << median(r.exposed_comm_ms, 1) << " | " << median(r.other_ms, 1) << " |\n";
  }

  md << "\n## Recommendation\n\n";
  if (analysis.recommendations.empty()) md << "Nothing to recommend: no model has a one-device baseline.\n";
  for (const auto& rec : analysis.recommendations) {
    md << "- **" << rec.model << ": " << rec.strategy;
    if (rec.world > 1) md << " on " << rec.world << " devices";
    md << "**: " << rec.why << ".\n";
  }

  const auto& s = analysis.scaling;
  if (s.intra || s.inter || !s.notes.empty()) {
    md << "\n## Projection (alpha-beta model; ring all-reduce, and halving-doubling alongside)\n\n";
    auto link_text = [](const Link& l) {
      return l.name + ": alpha " + num(l.alpha_s * 1e6, 1) + " us, bus bandwidth " + num(l.busbw_Bps / 1e9, 2) +
             " GB/s";
    };
    if (s.intra) md << "- Intra-node link " << link_text(*s.intra) << "\n";
    const bool several_nodes =
        std::any_of(s.validation.begin(), s.validation.end(), [](const ValidationRow& v) { return v.nodes > 1; }) ||
        std::any_of(s.projections.begin(), s.projections.end(), [](const ProjectionRow& p) { return p.prediction.nodes > 1; });
    if (s.inter && several_nodes) md << "- Inter-node link " << link_text(*s.inter) << "\n";
    if (!s.sweep.empty()) {
      md << "- Sweep (" << s.sweep_world << " ranks on " << s.sweep_nodes << " node(s)): ";
      for (size_t i = 0; i < s.sweep.size(); ++i) {
        md << (i ? ", " : "") << num(s.sweep[i].bytes / 1024.0, 0) << " KiB " << num(s.sweep[i].seconds * 1e3, 3)
           << " ms";
      }
      md << "\n";
    }
    for (const auto& note : s.notes) md << "- Note: " << note << "\n";
    if (!s.validation.empty()) {
      md << "\n### Validation: predicted against measured (Tandem DDP; world 1: one device)\n\n"
            "| model | ranks | nodes | measured step ms | predicted ms | error |\n|---|---|---|---|---|---|\n";
      for (const auto& v : s.validation) {
        md << "| " << v.model << " | " << v.world << " | " << v.nodes << " | " << num(v.measured_s * 1e3, 1) << " | "
           << num(v.predicted_s * 1e3, 1) << " | "
           << error_cell(v) << " |\n";
      }
    }
    if (!s.projections.empty()) {
      md << "\n### Projected\n\n| model | devices per node × nodes | compute ms | overlap | all-reduce × "
            "| all-reduce ms | exposed ms | step ms | scaling eff. | step ms, tree | scaling eff., tree |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n";
      for (const auto& p : s.projections) {
        md << "| " << p.model << " | " << p.prediction.devices_per_node << " × " << p.prediction.nodes << " | "
           << num(p.compute_s * 1e3, 1) << " | " << num(p.overlap, 2) << " | " << num(p.comm_scale, 2) << " | "
           << num(p.prediction.comm_s * 1e3, 2) << " | "
           << num(p.prediction.exposed_comm_s * 1e3, 2) << " | " << num(p.prediction.step_s * 1e3, 1) << " | "
           << num(p.prediction.efficiency, 2) << " | " << num(p.tree_prediction.step_s * 1e3, 1) << " | "
           << num(p.tree_prediction.efficiency, 2) << " |\n";
      }
    }
  }

  bool any_unsupported = false;
  for (const auto& r : results.runs) any_unsupported |= !r.unsupported.empty();
  if (any_unsupported || !results.failures.empty()) {
    md << "\n## Not measured\n\n";
    std::set<std::string> said;
    for (const auto& r : results.runs) {
      if (r.unsupported.empty()) continue;
      const std::string line = "- " + r.impl + " " + r.strategy + " (" + device_count(r.world) + "): " +
                               r.unsupported;
      if (said.insert(line).second) md << line << "\n";
    }
    for (const auto& f : results.failures) {
      md << "- FAILED " << f.measurement.impl << " " << f.measurement.model << " " << f.measurement.strategy << " ("
         << device_count(f.measurement.world) << "), repeat " << f.repeat << ": " << f.reason << "\n";
    }
  }
  return md.str();
}

std::string render_comparison(const std::string& name_a, const Results& a, const Analysis& analysis_a,
                              const std::string& name_b, const Results& b, const Analysis& analysis_b) {
  std::ostringstream md;
  md << "# tandem report: " << name_b << " against " << name_a << "\n\n";
  md << "- A: " << name_a << " (" << a.created_utc << ", " << describe_machine(a) << ")\n";
  md << "- B: " << name_b << " (" << b.created_utc << ", " << describe_machine(b) << ")\n\n";
  md << "| model | strategy | devices | A samples/s | B samples/s | B ÷ A | A p50 ms | B p50 ms |\n"
        "|---|---|---|---|---|---|---|---|\n";
  std::vector<std::string> only;
  for (const auto& ra : analysis_a.rows) {
    const Row* rb = find_row(analysis_b.rows, ra.model, ra.impl, ra.strategy, ra.world, ra.nodes);
    if (!rb) {
      only.push_back("only in A: " + ra.model + " " + label(ra) + " (" + device_count(ra) + ")");
      continue;
    }
    const bool both = !ra.samples_per_s.empty() && !rb->samples_per_s.empty();
    md << "| " << ra.model << " | " << label(ra) << " | " << devices(ra) << " | " << cell(ra.samples_per_s, 0) << " | "
       << cell(rb->samples_per_s, 0) << " | "
       << (both ? num(rb->samples_per_s.median / ra.samples_per_s.median, 2) : "–") << " | "
       << median(ra.p50_ms, 1) << " | " << median(rb->p50_ms, 1) << " |\n";
  }
  for (const auto& rb : analysis_b.rows) {
    if (!find_row(analysis_a.rows, rb.model, rb.impl, rb.strategy, rb.world, rb.nodes)) {
      only.push_back("only in B: " + rb.model + " " + label(rb) + " (" + device_count(rb) + ")");
    }
  }
  if (!only.empty()) {
    md << "\n";
    for (const auto& line : only) md << "- " << line << "\n";
  }
  md << "\nRatios across two runs compare two machines or two moments: on a noisy machine, "
        "trust ratios within one run (results.md) more.\n";
  return md.str();
}

}  // namespace tandem::bench
