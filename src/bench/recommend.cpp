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
        why += ": more devices do not pay for themselves on this machine";
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
      for (const Row* c : candidates) {
        if (c == best) continue;
        why += "; " + strategy_name(*c, rows) + " " + fmt("%.2f", c->samples_per_s.median / best->samples_per_s.median) + "x";
        if (!c->mem_primary_MB.empty() && !c->mem_others_MB.empty() &&
            c->mem_primary_MB.median > c->mem_others_MB.median * 1.1) {
          why += " with its primary at " + fmt("%.0f", c->mem_primary_MB.median) + " MiB against " +
                 fmt("%.0f", c->mem_others_MB.median) + " MiB on the others";
        }
      }
    }
    rec.why = why;
    out.push_back(std::move(rec));
  }
  return out;
}

}  // namespace tandem::bench
