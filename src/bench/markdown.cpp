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

// The strategy table's label (a name it lacks: "Tandem NAME" / "PyTorch NAME").
std::string base_label(const Row& r) {
  const bool ours = r.impl == "tandem";
  if (const Strategy* s = find_strategy(r.strategy)) return ours ? s->label : s->peer_label;
  return (ours ? "Tandem " : "PyTorch ") + r.strategy;
}

// "Tandem ddp", or "Tandem ddp (mpi)" / "PyTorch ddp (gloo)" when the run compares backends (it
// measured MPI, alone or beside Gloo: a Gloo-only run's labels stay as they always were).
std::string label(const Row& r, bool with_backend) {
  return with_backend && !r.backend.empty() ? base_label(r) + " (" + r.backend + ")" : base_label(r);
}

std::string backend_suffix(const std::string& backend) { return backend.empty() ? "" : " on " + backend; }

std::string size_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// The all-reduce sweeps, one column pair per (world, backend): p50 and bus bandwidth.
void render_sweeps(const Analysis& analysis, std::ostringstream& md) {
  const auto& sweeps = analysis.sweeps;
  if (sweeps.empty()) return;
  std::set<int64_t> sizes;
  for (const Run& r : sweeps) {
    for (const auto& p : r.sweep) sizes.insert(p.bytes);
  }
  md << "\n## All-reduce sweep (float32 sum; p50 ms, bus bandwidth GB/s)\n\n| size |";
  for (const Run& r : sweeps) {
    md << " " << r.world << " ranks" << (r.backend.empty() ? "" : ", " + r.backend) << " ms | GB/s |";
  }
  md << "\n|---|";
  for (size_t i = 0; i < sweeps.size(); ++i) md << "---|---|";
  md << "\n";
  for (int64_t bytes : sizes) {
    md << "| " << size_text(bytes) << " |";
    for (const Run& r : sweeps) {
      auto it = std::find_if(r.sweep.begin(), r.sweep.end(), [&](const SweepPoint& p) { return p.bytes == bytes; });
      if (it == r.sweep.end() || it->seconds <= 0) {
        md << " – | – |";
        continue;
      }
      const double busbw = static_cast<double>(bytes) / it->seconds * 2.0 * (r.world - 1) / r.world / 1e9;
      md << " " << num(it->seconds * 1e3, 3) << " | " << num(busbw, 2) << " |";
    }
    md << "\n";
  }
}

// "Gloo vs MPI": Tandem's measurement on both backends and PyTorch's on Gloo, ratios per repeat.
void render_backends(const Analysis& analysis, std::ostringstream& md) {
  if (analysis.backends.empty()) return;
  md << "\n## Gloo vs MPI (Tandem on both CPU backends, PyTorch on Gloo; p50 ms, ratios within each repeat)\n\n"
        "| model | devices | measurement | Tandem Gloo ms | Tandem MPI ms | Gloo ÷ MPI | PyTorch (Gloo) ms "
        "| PyTorch ÷ Tandem MPI | PyTorch ÷ Tandem Gloo |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& c : analysis.backends) {
    const Strategy* s = find_strategy(c.strategy);
    const std::string what = s ? s->what : c.strategy + " step";
    md << "| " << c.model << " | " << c.world << " | " << what << " | " << cell(c.gloo_ms, 1) << " | "
       << cell(c.mpi_ms, 1) << " | " << cell(c.gloo_over_mpi, 2) << " | "
       << (c.peer_strategy.empty() ? "–" : cell(c.peer_ms, 1)) << " | " << cell(c.peer_over_mpi, 2) << " | "
       << cell(c.peer_over_gloo, 2) << " |\n";
  }
  md << "\nA ratio above 1 means the second-named side is faster per step. PyTorch's wheel has no MPI "
        "backend, so its figures are Gloo's.\n";
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

// Accounted model state of the rows that recorded it (DDP and ZeRO): the busiest rank's bytes by
// kind, and its optimizer state against the same implementation's DDP row.
void render_model_state(const Analysis& analysis, bool backends, std::ostringstream& md) {
  if (std::none_of(analysis.rows.begin(), analysis.rows.end(), [](const Row& r) { return !r.state_params_MB.empty(); })) {
    return;
  }
  md << "\n## Model state per rank (accounted, MiB, the largest rank)\n\n"
        "| model | strategy | devices | parameters | gradients | optimizer state | total | optimizer ÷ DDP's |\n"
        "|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : analysis.rows) {
    if (r.state_params_MB.empty()) continue;
    const Row* ddp = find_row(analysis.rows, r.model, r.impl, "ddp", r.world, r.nodes, r.backend);
    const double total = r.state_params_MB.median + r.state_grads_MB.median + r.state_optimizer_MB.median;
    const bool ratio = ddp && !ddp->state_optimizer_MB.empty() && ddp->state_optimizer_MB.median > 0;
    md << "| " << r.model << " | " << label(r, backends) << " | " << devices(r) << " | " << median(r.state_params_MB, 2)
       << " | " << median(r.state_grads_MB, 2) << " | " << median(r.state_optimizer_MB, 2) << " | " << num(total, 2)
       << " | " << (ratio ? num(r.state_optimizer_MB.median / ddp->state_optimizer_MB.median, 2) : "–") << " |\n";
  }
  md << "\nCounted from the tensors each rank holds (its parameters, the gradients a step materialises, its "
        "optimizer's state), not its RSS. With ZeRO-1 a rank keeps the optimizer state of its share of the "
        "parameters only; with ZeRO-2 its gradients too; with FSDP its parameters too (the columns then hold its "
        "shards).\n";
  if (std::none_of(analysis.rows.begin(), analysis.rows.end(), [](const Row& r) { return !r.transient_MB.empty(); })) {
    return;
  }
  md << "\n### FSDP: the peak inside a step (accounted, MiB, the largest rank)\n\n"
        "| model | strategy | devices | at rest | peak in a step | at rest + two largest units | total ÷ DDP's |\n"
        "|---|---|---|---|---|---|---|\n";
  for (const auto& r : analysis.rows) {
    if (r.transient_MB.empty()) continue;
    const Row* ddp = find_row(analysis.rows, r.model, r.impl, "ddp", r.world, r.nodes, r.backend);
    const double rest = r.state_params_MB.median + r.state_grads_MB.median + r.state_optimizer_MB.median;
    const double ddp_total = ddp && !ddp->state_params_MB.empty()
                                 ? ddp->state_params_MB.median + ddp->state_grads_MB.median + ddp->state_optimizer_MB.median
                                 : 0;
    md << "| " << r.model << " | " << label(r, backends) << " | " << devices(r) << " | " << num(rest, 2) << " | "
       << num(rest + r.transient_MB.median, 2) << " | " << num(rest + r.two_units_MB.median, 2) << " | "
       << (ddp_total > 0 ? num(rest / ddp_total, 2) : "–") << " |\n";
  }
  md << "\nAt rest: the shards, their gradients and the optimizer's state of the shards. The peak adds what a "
        "step holds at once beyond that: gathered units (the root unit stays gathered from forward to the end "
        "of backward; with prefetching the next unit is gathered while one runs) and a unit's whole gradients "
        "until they are reduce-scattered. The formula beside it is the state at rest plus the two largest "
        "units' whole parameters.\n";
}

// FSDP's step by phase, with the communication its schedule did not hide, beside the same
// model's DDP row at the same world size.
void render_fsdp_step(const Analysis& analysis, bool backends, std::ostringstream& md) {
  if (std::none_of(analysis.rows.begin(), analysis.rows.end(), [](const Row& r) { return !r.exposed_gather_ms.empty(); })) {
    return;
  }
  md << "\n### FSDP's step by phase (ms, rank 0, medians)\n\n"
        "| model | strategy | devices | step | forward | backward | optimizer | exposed all-gather | exposed reduce |\n"
        "|---|---|---|---|---|---|---|---|---|\n";
  std::set<const Row*> shown;
  for (const auto& r : analysis.rows) {
    if (r.exposed_gather_ms.empty()) continue;
    auto line = [&](const Row& x, const std::string& gather, const std::string& reduce) {
      md << "| " << x.model << " | " << label(x, backends) << " | " << devices(x) << " | " << median(x.p50_ms, 1) << " | "
         << median(x.forward_ms, 1) << " | " << median(x.backward_ms, 1) << " | " << median(x.optimizer_ms, 1) << " | "
         << gather << " | " << reduce << " |\n";
    };
    // DDP's row once, before the first sharded row of its model and world (fsdp, fsdp+tp).
    if (const Row* ddp = find_row(analysis.rows, r.model, r.impl, "ddp", r.world, r.nodes, r.backend);
        ddp && shown.insert(ddp).second) {
      line(*ddp, "–", median(ddp->exposed_comm_ms, 1));
    }
    line(r, median(r.exposed_gather_ms, 1), median(r.exposed_reduce_scatter_ms, 1));
  }
  md << "\nFSDP's exposed times are the host time its step spent blocked waiting for a unit's all-gather (a "
        "prefetch that had not arrived) or for the reduce-scatters still running when backward ended: the "
        "communication its schedule did not hide. They do not count compute slowed by collectives sharing its "
        "cores. DDP's exposed reduce is its synced step minus its no_sync step (the all-reduce not hidden).\n";
}

// Tensor parallelism's own communication: the TP group's collectives per step, beside the same
// model's DDP row at the same world size (what the batch-parallel alternative costs), and the
// model state each rank holds (what TP saves).
void render_tensor_parallel(const Analysis& analysis, bool backends, std::ostringstream& md) {
  if (std::none_of(analysis.rows.begin(), analysis.rows.end(), [](const Row& r) { return !r.tp_comm_ms.empty(); })) {
    return;
  }
  md << "\n### Tensor parallelism: its collectives per step (rank 0, medians)\n\n"
        "| model | strategy | devices | TP group | step ms | collectives | MiB through them | ms blocked in them "
        "| share of step | model state MiB/rank | DDP's step ms | DDP's exposed comm ms | DDP's model state MiB/rank |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto state = [](const Row& r) {
    return r.state_params_MB.empty() ? std::string("–")
                                     : num(r.state_params_MB.median + r.state_grads_MB.median + r.state_optimizer_MB.median, 2);
  };
  for (const auto& r : analysis.rows) {
    if (r.tp_comm_ms.empty()) continue;
    const Row* ddp = find_row(analysis.rows, r.model, r.impl, "ddp", r.world, r.nodes, r.backend);
    const std::string share =
        r.p50_ms.empty() || r.p50_ms.median <= 0 ? "–" : num(100.0 * r.tp_comm_ms.median / r.p50_ms.median, 0) + " %";
    md << "| " << r.model << " | " << label(r, backends) << " | " << devices(r) << " | " << r.tp_size << " | "
       << median(r.p50_ms, 1) << " | " << median(r.tp_collectives, 0) << " | " << median(r.tp_comm_MB, 2) << " | "
       << median(r.tp_comm_ms, 1) << " | " << share << " | " << state(r) << " | "
       << (ddp ? median(ddp->p50_ms, 1) : "–") << " | " << (ddp ? median(ddp->exposed_comm_ms, 1) : "–") << " | "
       << (ddp ? state(*ddp) : "–") << " |\n";
  }
  md << "\nA tensor-parallel layer waits for its collective before the next one can start (the activations, "
        "forward, and their gradients, backward, cross the TP group at every cut layer), so the time blocked in "
        "them is all exposed; it grows with the batch, while DDP's gradient all-reduce grows with the model and "
        "overlaps backward. What TP buys is memory: each rank holds 1/TP of the cut layers' parameters, "
        "gradients and optimizer state. A TP group trains one batch of TP x the per-device batch, so a rank's "
        "activations of the cut layers are as large as a DDP rank's, and those of the layers left whole (the "
        "residual stream, the norms) TP times larger. MiB through them counts each collective's whole buffer "
        "(the sweep's convention).\n";
}

// Pipeline parallelism: each rank's share of the step blocked on its neighbours beside the
// theory's bubble, and the activations each held at once; then GPipe against 1F1B, stage by
// stage, where both ran at the same world (what 1F1B's order saves).
void render_pipeline(const Analysis& analysis, bool backends, std::ostringstream& md) {
  auto pipelined = [](const Row& r) { return !r.pp_schedule.empty(); };
  if (std::none_of(analysis.rows.begin(), analysis.rows.end(), pipelined)) return;
  auto by_rank = [](const std::vector<Stat>& stats, double scale, int digits, const char* unit) {
    std::string text;
    for (const auto& s : stats) text += (text.empty() ? "" : " / ") + (s.empty() ? "–" : num(s.median * scale, digits) + unit);
    return text.empty() ? std::string("–") : text;
  };
  md << "\n### Pipeline: bubble and activation memory per stage (medians)\n\n"
        "| model | strategy | devices | microbatches | step ms | bubble in theory | bubble measured, by rank "
        "| activations held MiB, by rank |\n"
        "|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : analysis.rows) {
    if (!pipelined(r)) continue;
    md << "| " << r.model << " | " << label(r, backends) << " | " << devices(r) << " | " << r.pp_microbatches
       << (r.pp_stages_per_rank > 1 ? " (" + std::to_string(r.pp_stages_per_rank) + " stages per rank)" : "") << " | "
       << median(r.p50_ms, 1) << " | " << num(100.0 * r.pp_bubble_theory, 0) << " % | "
       << by_rank(r.pp_bubble, 100.0, 0, " %") << " | " << by_rank(r.pp_activation_MB, 1.0, 2, "") << " |\n";
  }
  bool compared = false;
  for (const auto& r : analysis.rows) {
    if (r.pp_schedule != "1f1b") continue;
    const Row* gpipe = find_row(analysis.rows, r.model, r.impl, "pp-gpipe", r.world, r.nodes, r.backend);
    if (!gpipe || r.pp_activation_MB.empty() || gpipe->pp_activation_MB.size() != r.pp_activation_MB.size()) continue;
    std::string stages;
    for (size_t k = 0; k < r.pp_activation_MB.size(); ++k) {
      const Stat &one = r.pp_activation_MB[k], &all = gpipe->pp_activation_MB[k];
      if (one.empty() || all.empty() || all.median <= 0) continue;
      stages += (stages.empty() ? "" : ", ") + std::string("on stage ") + std::to_string(k) + " " + num(one.median, 2) +
                " MiB against " + (stages.empty() ? "GPipe's " : "") + num(all.median, 2) + " (" +
                num(100.0 * one.median / all.median, 0) + " %)";
    }
    if (stages.empty()) continue;
    if (!compared) md << "\n";
    compared = true;
    md << "- " << r.model << ", " << base_label(r) << " at " << device_count(r.world) << backend_suffix(backends ? r.backend : "")
       << ", " << r.pp_microbatches << " microbatches: activations held " << stages << ".\n";
  }
  md << "\nThe bubble in theory is (P - 1) / (v m + P - 1) for P ranks, v stages per rank and m microbatches: the "
        "idle share of an ideal pipeline of equal stages whose messages cost nothing. The bubble measured is the "
        "share of the step a rank waited on its neighbours (receiving, and for its sends to complete): it adds the "
        "messages' own time and the stages' imbalance (the first holds the embeddings, the last the head and the "
        "loss). Activations held: the most bytes a step held at once on the rank beyond those alive when it began "
        "(activations kept for backward, messages in flight, backward's transients), counted by Tandem's allocator on "
        "CPU, by the device allocator's peak on CUDA; PyTorch's CPU allocator keeps no such count (–). GPipe keeps "
        "every microbatch's activations until its backwards begin; 1F1B at most P - s on stage s, whatever m.\n";
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

}  // namespace

std::string render_markdown(const Results& results, const Analysis& analysis) {
  const auto& c = results.config;
  const bool backends = analysis.names_backends;
  std::ostringstream md;
  md << "# tandem bench: " << results.created_utc << "\n\n";
  md << "- Machine: " << describe_machine(results) << "\n";
  md << "- Tandem " << results.tandem_version;
  if (!analysis.torch_version.empty()) md << ", LibTorch/PyTorch " << analysis.torch_version;
  md << "; device " << c.device << ", precision " << c.precision << ", " << c.threads
     << " intra-op thread(s) per process, model presets '" << c.scale << "'\n";
  md << "- " << c.repeats << " repeats (interleaved), " << c.steps << " timed steps after " << c.warmup
     << " warm-up steps per measurement; figures are medians over repeats (min...max)\n";
  if (!results.command.empty()) md << "- Command: `" << results.command << "`\n";
  if (backends) {
    std::string list;
    for (const auto& b : c.backends) list += (list.empty() ? "" : ", ") + b;
    md << "- CPU backends of Tandem's multi-process measurements: " << list
       << " (PyTorch's on Gloo; single and DataParallel run in one process)\n";
  }
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
      md << "| " << name << " | " << label(r, backends) << " | " << devices(r) << " | " << cell(r.samples_per_s, 0) << " | "
         << median(r.samples_per_s_device, 0) << " | " << cell(r.p50_ms, 1) << " | " << median(r.p95_ms, 1) << " | "
         << median(r.scaling_efficiency, 2) << " | " << median(r.mem_primary_MB, 0) << " | "
         << median(r.mem_others_MB, 0) << " | " << median(r.exposed_comm_ms, 1) << " | "
         << median(r.sync_busbw_GBps, 2) << " | " << peer << " |\n";
    }
  }
  md << "\nGradient: ";
  std::set<std::string> seen;
  for (const auto& r : analysis.rows) {
    // The bucket layout is DDP's own row's (the one whose figures are its own runs).
    const Strategy* s = find_strategy(r.strategy);
    if (r.impl != "tandem" || !s || s->comm.synced != r.strategy || !seen.insert(r.model).second) continue;
    md << (seen.size() > 1 ? "; " : "") << r.model << " " << num(r.grad_bytes / 1e6, 2) << " MB in " << r.buckets
       << " bucket(s)";
  }
  md << ". Memory is " << (c.device == "cpu" ? "each rank's peak RSS (DataParallel: each replica's accounted bytes)"
                                              : "each device's peak CUDA allocation")
     << ".\n";

  md << "\n## Where the step goes (ms, medians)\n\n";
  md << "| model | strategy | devices | step | compute (one device) | exposed comm | other |\n|---|---|---|---|---|---|---|\n";
  for (const auto& r : analysis.rows) {
    if (r.impl != "tandem" || r.strategy == baseline().name) continue;
    md << "| " << r.model << " | " << label(r, backends) << " | " << devices(r) << " | " << median(r.p50_ms, 1) << " | "
       << median(r.compute_ms, 1) << " | " << median(r.exposed_comm_ms, 1) << " | " << median(r.other_ms, 1) << " |\n";
  }

  render_backends(analysis, md);
  render_model_state(analysis, backends, md);
  render_fsdp_step(analysis, backends, md);
  render_tensor_parallel(analysis, backends, md);
  render_pipeline(analysis, backends, md);

  md << "\n## Recommendation\n\n";
  if (analysis.recommendations.empty()) md << "Nothing to recommend: no model has a one-device baseline.\n";
  for (const auto& rec : analysis.recommendations) {
    md << "- **" << rec.model << ": " << recommendation_title(rec) << "**: " << rec.why << ".\n";
  }

  render_sweeps(analysis, md);

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

  if (!analysis.not_measured.empty() || !results.failures.empty()) {
    md << "\n## Not measured\n\n";
    std::set<std::string> said;
    for (const auto& r : analysis.not_measured) {
      const std::string line = "- " + r.impl + " " + r.strategy + " (" + device_count(r.world) +
                               (backends ? backend_suffix(r.backend) : "") + "): " + r.unsupported;
      if (said.insert(line).second) md << line << "\n";
    }
    for (const auto& f : results.failures) {
      md << "- FAILED " << f.measurement.impl << " " << f.measurement.model << " " << f.measurement.strategy << " ("
         << device_count(f.measurement.world) << (backends ? backend_suffix(f.measurement.backend) : "")
         << "), repeat " << f.repeat << ": " << f.reason << "\n";
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
  const bool backends = analysis_a.names_backends || analysis_b.names_backends;
  auto label = [&](const Row& r) { return bench::label(r, backends); };
  std::vector<std::string> only;
  for (const auto& ra : analysis_a.rows) {
    const Row* rb = find_row(analysis_b.rows, ra.model, ra.impl, ra.strategy, ra.world, ra.nodes, ra.backend);
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
    if (!find_row(analysis_a.rows, rb.model, rb.impl, rb.strategy, rb.world, rb.nodes, rb.backend)) {
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
