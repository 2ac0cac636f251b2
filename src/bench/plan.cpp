#include "bench/plan.h"

#include <algorithm>
#include <sstream>

#include "tandem/error.h"

namespace tandem::bench {

const std::vector<std::string>& user_strategies() {
  static const std::vector<std::string> all{"single", "dp-replicate", "dp-persistent", "ddp", "accelerate"};
  return all;
}

namespace {

// PyTorch's counterpart of each of our strategies: both DataParallel modes face
// torch.nn.DataParallel (which the peer reports unsupported on CPU).
std::string peer_strategy(const std::string& ours) {
  if (ours == "dp-replicate" || ours == "dp-persistent") return "dp";
  return ours;
}

}  // namespace

std::vector<Measurement> measurements(const BenchConfig& config, bool with_peers) {
  std::vector<Measurement> out;
  auto add = [&](const std::string& impl, const std::string& model, const std::string& strategy, int world) {
    Measurement m{impl, model, strategy, world};
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  };
  for (const auto& model : config.models) {
    // The one-device baseline, always: scaling efficiency and the step breakdown divide by it.
    add("tandem", model, "single", 1);
    if (with_peers) add("pytorch", model, "single", 1);
    for (const auto& strategy : config.strategies) {
      for (int world : config.worlds) {
        if (strategy == "single" || world == 1) continue;  // a wrapper over one device is the baseline plus overhead
        add("tandem", model, strategy, world);
        if (with_peers) add("pytorch", model, peer_strategy(strategy), world);
        if (strategy == "ddp" || strategy == "accelerate") {  // the Accelerator's rows carry DDP's figures
          add("tandem", model, "ddp", world);
          if (with_peers) add("pytorch", model, "ddp", world);
          add("tandem", model, "ddp-no-sync", world);
          if (with_peers) add("pytorch", model, "ddp-no-sync", world);
          add("tandem", model, "allreduce", world);
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
  if (!config.project.empty()) {
    for (int world : config.worlds) {
      if (world > 1) {
        out.push_back({{"tandem", config.models.front(), "sweep", world}, -1});
        break;
      }
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

}  // namespace tandem::bench
