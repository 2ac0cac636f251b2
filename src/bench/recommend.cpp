#include "bench/recommend.h"

#include <algorithm>
#include <cstdio>

namespace tandem::bench {

// Note [Recommendation]
// Only Tandem's strategies compete (the peers are the yardstick, not a choice in a C++ program),
// at the widest world measured, against one device:
// 1. The candidate with the highest median samples/s wins, unless it beats one device by less
//    than 5 %: then more devices do not pay for themselves here, and `single` is recommended.
// 2. A winner within 5 % of a candidate that needs at least 10 % less memory on its busiest
//    device, measured the same way, yields to it: equal speed, more headroom (DataParallel's
//    primary replica is the usual loser). Smaller memory differences are noise in a peak RSS.
// 3. The paragraph quotes the throughputs, the scaling efficiency, the busiest device's peak
//    memory against the others', and the exposed communication: the table's own numbers.
// 4. Tensor parallelism competes by the same rules: it pays for speed only where it wins rule 1
//    (every cut layer waits for its collective, so its communication is all exposed and grows with
//    the batch: it needs large layers and a fast link), and for memory where rule 2 gives it the
//    tie or where the others do not fit at all (then they have no row). Whatever the verdict, the
//    paragraph says for each TP row what it paid, the share of its step blocked in its TP
//    collectives and their bytes, and what it bought, its model state per rank against the
//    winner's (or one device's): the two numbers that decide whether it pays elsewhere.
// 5. Pipeline parallelism competes by the same rules; its account is the bubble: the largest
//    share of its step a rank waited on its neighbours, beside the theory's (P - 1) / (v m + P - 1)
//    (more microbatches shrink both, while each microbatch's work shrinks with them).

namespace {

constexpr double kMargin = 1.05;        // a throughput difference this small is a tie
constexpr double kMemoryMargin = 0.9;   // a tie goes to a strategy needing 10 % less on its busiest device

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

double busiest_MB(const Row& r) {
  double m = r.mem_primary_MB.empty() ? 0 : r.mem_primary_MB.median;
  if (!r.mem_others_MB.empty() && r.mem_others_MB.median > m) m = r.mem_others_MB.median;
  return m;
}

double state_MB(const Row& r) {
  if (r.state_params_MB.empty()) return 0;
  return r.state_params_MB.median + r.state_grads_MB.median + r.state_optimizer_MB.median;
}

// Rule 4's account of a TP row: " (TP group of 2: 43 % of its step blocked in 120 TP collectives,
// 8.1 MiB per step; 12 MiB of model state per rank against ddp's 24)"; "" for other rows.
std::string tensor_parallel_account(const Row& r, const Row* against, const std::vector<Row>& rows) {
  if (r.tp_comm_ms.empty() || r.p50_ms.empty() || r.p50_ms.median <= 0) return "";
  std::string text = " (TP group of " + std::to_string(r.tp_size) + ": " +
                     fmt("%.0f", 100.0 * r.tp_comm_ms.median / r.p50_ms.median) + " % of its step blocked in " +
                     fmt("%.0f", r.tp_collectives.empty() ? 0.0 : r.tp_collectives.median) + " TP collectives, " +
                     fmt("%.1f", r.tp_comm_MB.empty() ? 0.0 : r.tp_comm_MB.median) + " MiB per step";
  if (state_MB(r) > 0 && against && against != &r && state_MB(*against) > 0) {
    text += "; " + fmt("%.1f", state_MB(r)) + " MiB of model state per rank against " + strategy_name(*against, rows) +
            "'s " + fmt("%.1f", state_MB(*against));
  }
  return text + ")";
}

// Rule 5's account of a pipeline row: " (pipeline of 4, 8 microbatches: up to 31 % of a step
// blocked on its neighbours, 27 % in theory)"; "" for other rows.
std::string pipeline_account(const Row& r) {
  if (r.pp_schedule.empty()) return "";
  double worst = -1;
  for (const auto& s : r.pp_bubble) {
    if (!s.empty()) worst = std::max(worst, s.median);
  }
  if (worst < 0) return "";
  return " (pipeline of " + std::to_string(r.world) + ", " + std::to_string(r.pp_microbatches) +
         " microbatches: up to " + fmt("%.0f", 100.0 * worst) + " % of a step blocked on its neighbours, " +
         fmt("%.0f", 100.0 * r.pp_bubble_theory) + " % in theory)";
}

// The close of rule 4 when TP ran but lost: when it would pay.
std::string tensor_parallel_verdict(const std::vector<const Row*>& candidates, const Row* winner) {
  for (const Row* c : candidates) {
    if (c != winner && !c->tp_comm_ms.empty()) {
      return "; tensor parallelism pays where its memory saving decides (a model whose state or activations do "
             "not fit one device) or where a faster link makes its per-layer collectives cheaper than the "
             "throughput it gives up here";
    }
  }
  return "";
}

}  // namespace

std::string strategy_name(const Row& row, const std::vector<Row>& rows) {
  if (row.backend.empty()) return row.strategy;
  const bool named = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.backend == "mpi"; });
  return named ? row.strategy + " (" + row.backend + ")" : row.strategy;
}

std::string recommendation_title(const Recommendation& rec) {
  std::string title = rec.strategy + (rec.backend.empty() ? "" : " (" + rec.backend + ")");
  if (rec.world > 1) title += " on " + std::to_string(rec.world) + " devices";
  return title;
}

std::vector<Recommendation> recommend(const std::vector<Row>& rows, const std::vector<std::string>& models) {
  std::vector<Recommendation> out;
  for (const auto& model : models) {
    const std::string& one_device = baseline().name;
    const Row* single = find_row(rows, model, "tandem", one_device, 1);
    int widest = 1;
    for (const auto& r : rows) {
      if (r.model == model && r.impl == "tandem" && r.nodes == 1 && r.world > widest) widest = r.world;
    }
    std::vector<const Row*> candidates;
    for (const auto& r : rows) {
      if (r.model == model && r.impl == "tandem" && r.world == widest && r.nodes == 1 && r.strategy != one_device &&
          !r.samples_per_s.empty()) {
        candidates.push_back(&r);
      }
    }
    if (!single || single->samples_per_s.empty()) continue;
    Recommendation rec;
    rec.model = model;
    const Row* best = nullptr;
    for (const Row* c : candidates) {
      if (!best || c->samples_per_s.median > best->samples_per_s.median) best = c;
    }
    // The tie-break compares like with like: memory of the same kind (RSS against RSS, never
    // against DataParallel's accounting of model bytes), measured on both, within 5 % of the
    // fastest (not of a previous tie-break's winner).
    if (const Row* top = best; top && !top->mem_primary_MB.empty()) {
      for (const Row* c : candidates) {
        if (c != top && c->mem_kind == top->mem_kind && !c->mem_primary_MB.empty() &&
            c->samples_per_s.median * kMargin >= top->samples_per_s.median &&
            busiest_MB(*c) < busiest_MB(*top) * kMemoryMargin && busiest_MB(*c) < busiest_MB(*best)) {
          best = c;
        }
      }
    }
    const double base = single->samples_per_s.median;
    std::string why;
    if (!best || best->samples_per_s.median < base * kMargin) {
      rec.strategy = one_device;
      rec.world = 1;
      why = "one device: " + fmt("%.0f", base) + " samples/s";
      if (best) {
        why += "; the best of " + std::to_string(widest) + " devices, " + strategy_name(*best, rows) + ", reaches only " +
               fmt("%.0f", best->samples_per_s.median) + " samples/s (" +
               fmt("%.2f", best->samples_per_s.median / base) + "x, scaling efficiency " +
               fmt("%.2f", best->scaling_efficiency.median) + ")";
        if (!best->exposed_comm_ms.empty()) {
          why += ", its step waits " + fmt("%.1f", best->exposed_comm_ms.median) + " ms for gradient sync";
        }
        why += tensor_parallel_account(*best, nullptr, rows) + pipeline_account(*best);
        why += ": more devices do not pay for themselves on this machine";
        for (const Row* c : candidates) {
          if (c != best && (!c->tp_comm_ms.empty() || !c->pp_schedule.empty())) {
            why += "; " + strategy_name(*c, rows) + " " + fmt("%.2f", c->samples_per_s.median / base) + "x one device" +
                   tensor_parallel_account(*c, best, rows) + pipeline_account(*c);
          }
        }
        why += tensor_parallel_verdict(candidates, nullptr);
      }
    } else {
      rec.strategy = best->strategy;
      rec.world = best->world;
      if (strategy_name(*best, rows) != best->strategy) rec.backend = best->backend;
      why = fmt("%.0f", best->samples_per_s.median) + " samples/s, " + fmt("%.2f", best->samples_per_s.median / base) +
            "x one device (scaling efficiency " + fmt("%.2f", best->scaling_efficiency.median) + ")";
      if (!best->exposed_comm_ms.empty()) {
        why += ", " + fmt("%.1f", best->exposed_comm_ms.median) + " ms of exposed gradient sync per step";
      }
      why += ", busiest device " + fmt("%.0f", busiest_MB(*best)) + " MiB";
      if (!best->tp_comm_ms.empty()) {
        // The row with the most model state per rank is what TP's saving is measured against.
        const Row* fullest = nullptr;
        for (const Row* c : candidates) {
          if (c != best && state_MB(*c) > 0 && (!fullest || state_MB(*c) > state_MB(*fullest))) fullest = c;
        }
        why += tensor_parallel_account(*best, fullest, rows) + ": tensor parallelism pays here";
      }
      why += pipeline_account(*best);
      for (const Row* c : candidates) {
        if (c == best) continue;
        why += "; " + strategy_name(*c, rows) + " " + fmt("%.2f", c->samples_per_s.median / best->samples_per_s.median) + "x";
        why += tensor_parallel_account(*c, best, rows) + pipeline_account(*c);
        if (!c->mem_primary_MB.empty() && !c->mem_others_MB.empty() &&
            c->mem_primary_MB.median > c->mem_others_MB.median * 1.1) {
          why += " with its primary at " + fmt("%.0f", c->mem_primary_MB.median) + " MiB against " +
                 fmt("%.0f", c->mem_others_MB.median) + " MiB on the others";
        }
      }
    }
    if (rec.strategy != one_device) why += tensor_parallel_verdict(candidates, best);
    rec.why = why;
    out.push_back(std::move(rec));
  }
  return out;
}

}  // namespace tandem::bench
