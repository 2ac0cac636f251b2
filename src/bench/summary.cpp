#include "bench/summary.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

namespace tandem::bench {

// Note [Metrics]
// Every figure is computed within one repeat and then summarised over the repeats (median,
// min..max), so that a ratio compares two measurements taken minutes apart at most:
// - samples/s = batch per device * devices / p50 step; per device = that / devices.
// - scaling efficiency = per-device samples/s / the same implementation's one-device samples/s
//   (weak scaling: the per-device batch is fixed, so 1.0 is perfect).
// - exposed communication = p50 of the synced DDP step - p50 of the same step under no_sync:
//   what synchronising gradients adds to a step after overlap with backward. The Accelerator
//   (and accelerate) run DDP underneath; their rows carry DDP's figure.
// - gradient-sync bus bandwidth = gradient bytes / time of their all-reduce in DDP's bucket
//   layout * 2(n-1)/n (NCCL-tests' busbw: comparable across world sizes, at most the link's).
// - breakdown: compute = the one-device step; exposed communication as above; other = the rest
//   (the wrapper's bookkeeping, DataParallel's replication and gathers, contention for cores).
// - memory: each device's peak (rank RSS on CPU, DataParallel's per-replica accounting, or
//   CUDA's peak allocation); device 0 is shown apart because DataParallel's primary holds more.

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

using ByRepeat = std::map<int, const Run*>;

ByRepeat runs_of(const Results& results, const std::string& model, const std::string& impl,
                 const std::string& strategy, int world, int nodes = 1) {
  ByRepeat out;
  for (const auto& r : results.runs) {
    if (r.model == model && r.impl == impl && r.strategy == strategy && r.world == world && r.nodes == nodes &&
        r.repeat >= 0 && r.unsupported.empty()) {
      out[r.repeat] = &r;
    }
  }
  return out;
}

double samples_per_s(const Run& r) { return static_cast<double>(r.batch_per_device) * r.world / r.p50_s; }

// f over the repeats where every measurement it needs exists (f returns nullopt otherwise).
Stat over_repeats(const ByRepeat& runs, const std::function<std::optional<double>(int, const Run&)>& f) {
  std::vector<double> values;
  for (const auto& [repeat, run] : runs) {
    if (auto v = f(repeat, *run)) values.push_back(*v);
  }
  return stat_of(values);
}

std::optional<double> at(const ByRepeat& runs, int repeat, const std::function<double(const Run&)>& f) {
  auto it = runs.find(repeat);
  if (it == runs.end()) return std::nullopt;
  return f(*it->second);
}

std::string peer_of(const std::string& strategy) {
  if (strategy == "dp-replicate" || strategy == "dp-persistent") return "dp";
  return strategy;
}

}  // namespace

Stat stat_of(std::vector<double> values) {
  Stat s;
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return !std::isfinite(v); }), values.end());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  s.n = static_cast<int>(n);
  s.min = values.front();
  s.max = values.back();
  s.median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  return s;
}

std::vector<Row> summarize(const Results& results) {
  std::vector<Row> rows;
  std::vector<std::string> strategies = user_strategies();
  strategies.push_back("dp");  // torch.nn.DataParallel, the peer of both DataParallel modes
  std::vector<int> worlds{1};
  for (int w : results.config.worlds) {
    if (w > 1) worlds.push_back(w);
  }
  std::set<int> node_counts{1};
  for (const auto& r : results.runs) node_counts.insert(r.nodes);
  std::vector<std::pair<int, int>> shapes;  // (world, nodes)
  for (int world : worlds) {
    for (int nodes : node_counts) shapes.emplace_back(world, nodes);
  }
  for (const auto& model : results.config.models) {
    for (const std::string impl : {"tandem", "pytorch"}) {
      const auto single = runs_of(results, model, impl, "single", 1);
      for (const auto& strategy : strategies) {
        for (const auto& shape : shapes) {
          const int world = shape.first, nodes = shape.second;
          const auto runs = runs_of(results, model, impl, strategy, world, nodes);
          if (runs.empty()) continue;
          const Run& first = *runs.begin()->second;
          Row row;
          row.model = model;
          row.impl = impl;
          row.strategy = strategy;
          row.world = world;
          row.nodes = nodes;
          row.params = first.params;
          row.grad_bytes = first.grad_bytes;
          row.batch_per_device = first.batch_per_device;
          row.buckets = first.buckets;
          row.mem_kind = first.mem_kind;
          row.samples_per_s = over_repeats(runs, [](int, const Run& r) { return samples_per_s(r); });
          row.samples_per_s_device = over_repeats(runs, [](int, const Run& r) { return samples_per_s(r) / r.world; });
          row.p50_ms = over_repeats(runs, [](int, const Run& r) { return r.p50_s * 1e3; });
          row.p95_ms = over_repeats(runs, [](int, const Run& r) { return r.p95_s * 1e3; });
          row.scaling_efficiency = over_repeats(runs, [&](int k, const Run& r) -> std::optional<double> {
            auto base = at(single, k, [](const Run& s) { return samples_per_s(s); });
            if (!base) return std::nullopt;
            return samples_per_s(r) / r.world / *base;
          });
          const bool over_ddp = strategy == "ddp" || strategy == "accelerate";
          // No no_sync run across nodes? The no_sync step does not communicate: one node's serves.
          const auto synced = over_ddp ? runs_of(results, model, impl, "ddp", world, nodes) : ByRepeat{};
          auto no_sync = over_ddp ? runs_of(results, model, impl, "ddp-no-sync", world, nodes) : ByRepeat{};
          if (over_ddp && no_sync.empty()) no_sync = runs_of(results, model, impl, "ddp-no-sync", world, 1);
          auto exposed_s = [&](int k) -> std::optional<double> {
            if (!over_ddp) return 0.0;
            auto s = at(synced, k, [](const Run& r) { return r.p50_s; });
            auto n = at(no_sync, k, [](const Run& r) { return r.p50_s; });
            if (!s || !n) return std::nullopt;
            return *s - *n;
          };
          if (over_ddp) {
            row.exposed_comm_ms = over_repeats(runs, [&](int k, const Run&) -> std::optional<double> {
              auto e = exposed_s(k);
              return e ? std::optional<double>(*e * 1e3) : std::nullopt;
            });
            const auto allreduce = runs_of(results, model, "tandem", "allreduce", world, nodes);
            if (impl == "tandem") {
              row.sync_busbw_GBps = over_repeats(allreduce, [](int, const Run& r) -> std::optional<double> {
                if (r.allreduce_p50_s <= 0) return std::nullopt;
                return r.grad_bytes / r.allreduce_p50_s * 2.0 * (r.world - 1) / r.world / 1e9;
              });
            }
          }
          row.compute_ms = over_repeats(runs, [&](int k, const Run&) {
            return at(single, k, [](const Run& s) { return s.p50_s * 1e3; });
          });
          row.other_ms = over_repeats(runs, [&](int k, const Run& r) -> std::optional<double> {
            auto compute = at(single, k, [](const Run& s) { return s.p50_s; });
            auto exposed = exposed_s(k);
            if (!compute || !exposed) return std::nullopt;
            return (r.p50_s - *compute - *exposed) * 1e3;
          });
          row.mem_primary_MB = over_repeats(runs, [](int, const Run& r) -> std::optional<double> {
            if (r.peak_mem_bytes.empty()) return std::nullopt;
            return r.peak_mem_bytes.front() / kMiB;
          });
          row.mem_others_MB = over_repeats(runs, [](int, const Run& r) -> std::optional<double> {
            if (r.peak_mem_bytes.size() < 2) return std::nullopt;
            return *std::max_element(r.peak_mem_bytes.begin() + 1, r.peak_mem_bytes.end()) / kMiB;
          });
          if (impl == "tandem") {
            const auto peer = runs_of(results, model, "pytorch", peer_of(strategy), world, nodes);
            if (!peer.empty()) {
              row.peer_strategy = peer_of(strategy);
              row.vs_peer = over_repeats(runs, [&](int k, const Run& r) -> std::optional<double> {
                auto theirs = at(peer, k, [](const Run& p) { return samples_per_s(p); });
                if (!theirs) return std::nullopt;
                return samples_per_s(r) / *theirs;
              });
            }
          }
          rows.push_back(std::move(row));
        }
      }
    }
  }
  return rows;
}

const Row* find_row(const std::vector<Row>& rows, const std::string& model, const std::string& impl,
                    const std::string& strategy, int world, int nodes) {
  for (const auto& r : rows) {
    if (r.model == model && r.impl == impl && r.strategy == strategy && r.world == world && r.nodes == nodes) {
      return &r;
    }
  }
  return nullptr;
}

}  // namespace tandem::bench
