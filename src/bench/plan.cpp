#include "bench/plan.h"

#include <algorithm>
#include <sstream>

#include "tandem/error.h"

namespace tandem::bench {

// Note [Backends]
// `--backends gloo,mpi` compares the engines of CPU collectives (docs/design/mpi.md). Only
// Tandem's multi-process measurements depend on one, so only they run once per backend (the
// runner passes `--backend B` to `tandem run`); the one-process ones (single, dp-*) run once and
// carry no backend, and the PyTorch peers run on Gloo alone, PyTorch's wheel having no MPI. Every
// ratio to a peer therefore compares a Tandem backend with PyTorch on Gloo. Records written before
// the flag existed have no backend: their multi-process runs were Gloo's.

namespace {

bool runs_at(const Strategy& s, int world, bool at_world_one) {
  switch (s.worlds) {
    case Worlds::One: return world == 1;
    case Worlds::AboveOne: return world > 1;
    case Worlds::Any: return world > 1 || at_world_one;
  }
  return false;
}

}  // namespace

std::vector<Measurement> measurements(const BenchConfig& config, bool with_peers) {
  std::vector<Measurement> out;
  auto add_one = [&](const std::string& impl, const std::string& model, const std::string& strategy, int world,
                     const std::string& backend) {
    Measurement m{impl, model, strategy, world, normal_backend(strategy, backend)};
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  };
  // `s` at `world`, on each backend it supports, then its PyTorch peer (on Gloo).
  auto add = [&](const std::string& model, const Strategy& s, int world) {
    if (s.launch != Launch::Ranks) {
      add_one("tandem", model, s.name, world, "");
    } else {
      for (const auto& backend : config.backends) {
        if (std::find(s.backends.begin(), s.backends.end(), backend) != s.backends.end()) {
          add_one("tandem", model, s.name, world, backend);
        }
      }
    }
    if (with_peers && !s.peer.empty()) add_one("pytorch", model, s.peer, world, "gloo");
  };
  for (const auto& model : config.models) {
    // The one-device baseline, always: scaling efficiency and the step breakdown divide by it.
    add(model, baseline(), 1);
    for (const auto& name : config.strategies) {
      const Strategy& s = lookup_strategy(name);
      for (int world : config.worlds) {
        // A wrapper over one device is the baseline plus overhead: measured only when asked for
        // (--at-world-one, e.g. a GPU check of each wrapper's cost on one device).
        if (s.role == Role::Baseline || !runs_at(s, world, config.at_world_one)) continue;
        add(model, s, world);
        if (s.comm.empty()) continue;
        for (const auto& support : {s.comm.synced, s.comm.no_sync, s.comm.allreduce}) {
          const Strategy& t = lookup_strategy(support);
          if (runs_at(t, world, config.at_world_one)) add(model, t, world);
        }
      }
    }
  }
  return out;
}

// Note [Interleaving]
// A 2-core machine drifts (thermal state, page cache, other tenants) over a ten-minute run. If
// every repeat of one configuration ran back to back, drift would land on some configurations
// and not others, and a ratio between them would measure the drift. Each repeat therefore runs
// every configuration once, and odd repeats run them in reverse order, so that a configuration
// early in one repeat is late in the next. Ratios are taken within one repeat, then the median.
std::vector<Planned> plan(const BenchConfig& config, bool with_peers) {
  const auto each = measurements(config, with_peers);
  std::vector<Planned> out;
  // The link sweep runs at the calibration world (the smallest above one, Note [Projection from
  // a run]): the wider worlds are then true predictions, link and all.
  // --sweep: at every world above one, for the backends' comparison.
  if (!config.project.empty() || config.sweep) {
    for (int world : config.worlds) {
      if (world <= 1) continue;
      for (const auto& backend : config.backends) {
        out.push_back({{"tandem", config.models.front(), link_sweep().name, world, backend}, -1});
      }
      if (!config.sweep) break;
    }
  }
  for (int r = 0; r < config.repeats; ++r) {
    if (r % 2 == 0) {
      for (const auto& m : each) out.push_back({m, r});
    } else {
      for (auto it = each.rbegin(); it != each.rend(); ++it) out.push_back({*it, r});
    }
  }
  return out;
}

std::vector<std::string> parse_list(const std::string& flag, const std::string& value,
                                    const std::vector<std::string>& allowed) {
  std::vector<std::string> out;
  std::stringstream in(value);
  std::string item;
  std::string expected;
  for (const auto& a : allowed) expected += (expected.empty() ? "" : ", ") + a;
  while (std::getline(in, item, ',')) {
    TANDEM_CHECK(std::find(allowed.begin(), allowed.end(), item) != allowed.end(), flag, ": unknown value '", item,
                 "' (expected a comma-separated list of ", expected, ")");
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  TANDEM_CHECK(!out.empty(), flag, " is empty (expected a comma-separated list of ", expected, ")");
  return out;
}

std::vector<std::string> parse_strategies(const std::string& value) {
  auto allowed = user_strategies();
  const auto groups = strategy_groups();
  for (const auto& group : groups) allowed.push_back(group.first);
  std::vector<std::string> out;
  for (const auto& item : parse_list("--strategies", value, allowed)) {
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == item; });
    for (const auto& name : group == groups.end() ? std::vector<std::string>{item} : group->second) {
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    }
  }
  return out;
}

std::vector<int> parse_worlds(const std::string& value) {
  TANDEM_CHECK(value.empty() || value.back() != ',', "--nproc: '", value, "' ends with a comma (expected e.g. 1,2,4)");
  std::vector<int> out;
  std::stringstream in(value);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int world = 0;
    try {
      world = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TANDEM_CHECK(used == item.size() && !item.empty() && world >= 1 && world <= 1024, "--nproc: '", item,
                 "' is not a world size (expected a comma-separated list of integers 1..1024, e.g. 1,2,4)");
    if (std::find(out.begin(), out.end(), world) == out.end()) out.push_back(world);
  }
  TANDEM_CHECK(!out.empty(), "--nproc is empty (expected world sizes, e.g. 1,2,4)");
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> parse_backends(const std::string& value, const std::string& device, bool mpi_built) {
  auto out = parse_list("--backends", value, {"gloo", "mpi"});
  const bool mpi = std::find(out.begin(), out.end(), "mpi") != out.end();
  TANDEM_CHECK(!mpi || device == "cpu", "--backends mpi: the backends are those of CPU collectives; with --device ",
               device, " the collectives run on NCCL (use --backends gloo, the default)");
  TANDEM_CHECK(!mpi || mpi_built,
               "--backends mpi: this build of Tandem has no MPI backend (install libopenmpi-dev and rebuild; "
               "`tandem env` shows the mpi line)");
  return out;
}

void check_sweep_sizes(int64_t min_bytes, int64_t max_bytes) {
  constexpr int64_t kMax = int64_t{4} << 30;
  TANDEM_CHECK(min_bytes >= 4 && min_bytes % 4 == 0, "--sweep-min-bytes: ", min_bytes,
               " is not a positive multiple of 4 (float32 elements)");
  TANDEM_CHECK(max_bytes >= min_bytes && max_bytes <= kMax && max_bytes % 4 == 0, "--sweep-max-bytes: ", max_bytes,
               " must be a multiple of 4 between --sweep-min-bytes (", min_bytes, ") and ", kMax);
}

}  // namespace tandem::bench
