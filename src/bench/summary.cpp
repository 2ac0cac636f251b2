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

// The backends to look for: the configuration's order, then any other a record names.
std::vector<std::string> backends_of(const Results& results) {
  std::vector<std::string> out = results.config.backends;
  for (const std::string b : {"gloo", "mpi"}) {
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  }
  return out;
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

std::vector<Row> summarize(const RunIndex& index) {
  const Results& results = index.results();
  std::vector<Row> rows;
  // The baseline, the compared strategies and torch.nn.DataParallel, the peer of both DataParallel modes.
  const auto strategies = strategy_names({Role::Baseline, Role::Compared, Role::PeerOnly});
  std::vector<int> worlds{1};
  for (int w : results.config.worlds) {
    if (w > 1) worlds.push_back(w);
  }
  std::vector<std::pair<int, int>> shapes;  // (world, nodes)
  for (int world : worlds) {
    for (int nodes : index.node_counts()) shapes.emplace_back(world, nodes);
  }
  for (const auto& model : results.config.models) {
    for (const std::string impl : {"tandem", "pytorch"}) {
      const auto& single = index.repeats(model, impl, baseline().name, 1);
      for (const auto& strategy : strategies) {
        const Strategy& entry = lookup_strategy(strategy);
        // Note [Backends] in plan.cpp: a multi-process strategy has a row per backend measured.
        const auto row_backends = multi_process(strategy) ? backends_of(results) : std::vector<std::string>{""};
        for (size_t each = 0; each < shapes.size() * row_backends.size(); ++each) {
          const auto& shape = shapes[each / row_backends.size()];
          const std::string& backend = row_backends[each % row_backends.size()];
          const int world = shape.first, nodes = shape.second;
          const auto& runs = index.repeats(model, impl, strategy, world, nodes, backend);
          if (runs.empty()) continue;
          const Run& first = *runs.begin()->second;
          Row row;
          row.model = model;
          row.impl = impl;
          row.strategy = strategy;
          row.backend = backend;
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
          // The runs a strategy without communication figures names are "": none are found.
          const CommFigures& comm = entry.comm;
          const bool over_ddp = !comm.empty();
          const auto& synced = index.repeats(model, impl, comm.synced, world, nodes, backend);
          // No no_sync run across nodes? The no_sync step does not communicate: one node's serves.
          const ByRepeat* no_sync_runs = &index.repeats(model, impl, comm.no_sync, world, nodes, backend);
          if (no_sync_runs->empty()) no_sync_runs = &index.repeats(model, impl, comm.no_sync, world, 1, backend);
          const ByRepeat& no_sync = *no_sync_runs;
          // FSDP measures its own: the host time blocked on its collectives (rank 0's).
          const bool measured = first.exposed_gather_s >= 0;
          // Tensor parallelism: its TP group's collectives block the step where they run (Note [TP
          // traffic] in bench/worker.cpp), so all their time is exposed; FSDP's is added under fsdp+tp.
          const bool tp_measured = first.tp_comm_s >= 0;
          auto exposed_s = [&](int k) -> std::optional<double> {
            double tp_part = 0;
            if (tp_measured) {
              auto t = at(runs, k, [](const Run& r) { return r.tp_comm_s; });
              if (!t || *t < 0) return std::nullopt;
              tp_part = *t;
            }
            if (measured) {
              auto g = at(runs, k, [](const Run& r) { return r.exposed_gather_s; });
              auto rs = at(runs, k, [](const Run& r) { return r.exposed_reduce_scatter_s; });
              if (!g || !rs || *g < 0 || *rs < 0) return std::nullopt;
              return *g + *rs + tp_part;
            }
            if (tp_measured) return tp_part;
            if (!over_ddp) return 0.0;
            auto s = at(synced, k, [](const Run& r) { return r.p50_s; });
            auto n = at(no_sync, k, [](const Run& r) { return r.p50_s; });
            if (!s || !n) return std::nullopt;
            return *s - *n;
          };
          auto ms = [&](double Run::*field) {
            return over_repeats(runs, [field](int, const Run& r) -> std::optional<double> {
              if (r.*field < 0) return std::nullopt;
              return r.*field * 1e3;
            });
          };
          row.forward_ms = ms(&Run::forward_s);
          row.backward_ms = ms(&Run::backward_s);
          row.optimizer_ms = ms(&Run::optimizer_s);
          if (measured) {
            row.exposed_gather_ms = ms(&Run::exposed_gather_s);
            row.exposed_reduce_scatter_ms = ms(&Run::exposed_reduce_scatter_s);
          }
          if (tp_measured) {
            row.tp_size = first.tp_size;
            row.tp_comm_ms = ms(&Run::tp_comm_s);
            row.tp_comm_MB = over_repeats(runs, [](int, const Run& r) -> std::optional<double> {
              if (r.tp_comm_bytes < 0) return std::nullopt;
              return static_cast<double>(r.tp_comm_bytes) / kMiB;
            });
            row.tp_collectives = over_repeats(runs, [](int, const Run& r) -> std::optional<double> {
              if (r.tp_collectives < 0) return std::nullopt;
              return static_cast<double>(r.tp_collectives);
            });
          }
          if (!first.pp_schedule.empty()) {  // by rank, over the repeats (a rank the record lacks: none)
            row.pp_schedule = first.pp_schedule;
            row.pp_microbatches = first.pp_microbatches;
            row.pp_stages_per_rank = first.pp_stages_per_rank;
            row.pp_bubble_theory = first.pp_bubble_theory;
            for (size_t rank = 0; rank < first.pp_bubble.size(); ++rank) {
              auto by_rank = [rank](const std::vector<double> Run::*field, double scale) {
                return [rank, field, scale](int, const Run& r) -> std::optional<double> {
                  const auto& values = r.*field;
                  if (rank >= values.size() || values[rank] < 0) return std::nullopt;
                  return values[rank] / scale;
                };
              };
              row.pp_bubble.push_back(over_repeats(runs, by_rank(&Run::pp_bubble, 1.0)));
              row.pp_activation_MB.push_back(over_repeats(runs, by_rank(&Run::pp_activation_bytes, kMiB)));
            }
          }
          if (over_ddp || measured || tp_measured) {
            row.exposed_comm_ms = over_repeats(runs, [&](int k, const Run&) -> std::optional<double> {
              auto e = exposed_s(k);
              return e ? std::optional<double>(*e * 1e3) : std::nullopt;
            });
            const auto& allreduce = index.repeats(model, "tandem", comm.allreduce, world, nodes, backend);
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
          for (size_t kind = 0; kind < 3; ++kind) {
            Stat& stat = kind == 0 ? row.state_params_MB : kind == 1 ? row.state_grads_MB : row.state_optimizer_MB;
            stat = over_repeats(runs, [kind](int, const Run& r) -> std::optional<double> {
              if (r.model_state.empty()) return std::nullopt;
              int64_t most = 0;
              for (const auto& rank : r.model_state) most = std::max(most, rank[kind]);
              return most / kMiB;
            });
          }
          for (size_t kind = 0; kind < 2; ++kind) {
            (kind == 0 ? row.transient_MB : row.two_units_MB) = over_repeats(runs, [kind](int, const Run& r) -> std::optional<double> {
              if (r.step_transient.empty()) return std::nullopt;
              int64_t most = 0;
              for (const auto& rank : r.step_transient) most = std::max(most, rank[kind]);
              return most / kMiB;
            });
          }
          if (impl == "tandem" && !entry.peer.empty()) {
            const auto& peer = index.repeats(model, "pytorch", entry.peer, world, nodes);
            if (!peer.empty()) {
              row.peer_strategy = entry.peer;
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
                    const std::string& strategy, int world, int nodes, const std::string& backend) {
  const std::string wanted = normal_backend(strategy, backend);
  for (const auto& r : rows) {
    if (r.model == model && r.impl == impl && r.strategy == strategy && r.world == world && r.nodes == nodes &&
        normal_backend(r.strategy, r.backend) == wanted) {
      return &r;
    }
  }
  return nullptr;
}

std::vector<BackendComparison> compare_backends(const RunIndex& index) {
  const Results& results = index.results();
  std::vector<BackendComparison> out;
  auto ratio = [](const ByRepeat& num, const ByRepeat& den, double Run::*field) {
    return over_repeats(num, [&](int k, const Run& n) -> std::optional<double> {
      auto d = at(den, k, [&](const Run& r) { return r.*field; });
      if (!d || *d <= 0) return std::nullopt;
      return n.*field / *d;
    });
  };
  auto ms = [](const ByRepeat& runs, double Run::*field) {
    return over_repeats(runs, [&](int, const Run& r) { return r.*field * 1e3; });
  };
  for (const auto& model : results.config.models) {
    for (int world : results.config.worlds) {
      if (world < 2) continue;
      for (const auto& entry : strategies()) {
        // Each compared multi-process strategy's step, and the gradient's all-reduce alone.
        const bool step = entry.role == Role::Compared && entry.launch == Launch::Ranks;
        if (!step && entry.timing != Timing::GradientAllReduce) continue;
        const std::string& strategy = entry.name;
        const auto& gloo = index.repeats(model, "tandem", strategy, world, 1, "gloo");
        const auto& mpi = index.repeats(model, "tandem", strategy, world, 1, "mpi");
        if (gloo.empty() || mpi.empty()) continue;
        const auto field = step ? &Run::p50_s : &Run::allreduce_p50_s;
        BackendComparison c;
        c.model = model;
        c.strategy = strategy;
        c.world = world;
        c.gloo_ms = ms(gloo, field);
        c.mpi_ms = ms(mpi, field);
        c.gloo_over_mpi = ratio(gloo, mpi, field);
        if (step && !entry.peer.empty()) {
          const auto& peer = index.repeats(model, "pytorch", entry.peer, world, 1, "gloo");
          if (!peer.empty()) {
            c.peer_strategy = entry.peer;
            c.peer_ms = ms(peer, &Run::p50_s);
            c.peer_over_mpi = ratio(peer, mpi, &Run::p50_s);
            c.peer_over_gloo = ratio(peer, gloo, &Run::p50_s);
          }
        }
        out.push_back(std::move(c));
      }
    }
  }
  return out;
}

}  // namespace tandem::bench
