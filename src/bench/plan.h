#pragma once
// What `tandem bench` measures: the configuration the user asked for, and the plan it becomes —
// every measurement of every repeat, interleaved (Note [Interleaving] in plan.cpp).
#include <map>
#include <string>
#include <vector>

namespace tandem::bench {

/// The strategies the user compares (`--strategies`), in the table's order.
const std::vector<std::string>& user_strategies();

/// The flags of `tandem bench`, after parsing. Defaults are the 10-minute run on 2 CPU cores.
struct BenchConfig {
  std::vector<std::string> models{"small", "medium", "large"};
  std::vector<std::string> strategies = user_strategies();
  std::vector<int> worlds{1, 2};           // --nproc: world sizes (devices)
  std::string precision = "fp32";
  std::string device = "cpu";
  std::string scale = "cpu";               // model presets: tiny (tests), cpu, full
  std::map<std::string, int> batch_sizes{{"small", 64}, {"medium", 32}, {"large", 8}};  // per device
  int steps = 10, warmup = 3, repeats = 3, threads = 1;
  std::string peers = "auto";              // auto (when the Python has them), on, off
  std::string python;                      // the interpreter for the PyTorch peers
  std::vector<std::string> project;        // --project shapes, e.g. "8x1", "8x4"
  std::string link_intra = "measured", link_inter = "ib100";
};

/// One measurement: a process group running one worker (ours or PyTorch's) once.
struct Measurement {
  std::string impl;      // "tandem" | "pytorch"
  std::string model;
  std::string strategy;  // a user strategy, or the supporting "ddp-no-sync", "allreduce", "sweep"
  int world = 1;
  bool operator==(const Measurement& o) const {
    return impl == o.impl && model == o.model && strategy == o.strategy && world == o.world;
  }
};

/// What runs once per repeat. Single runs at world 1, always (the baseline every ratio divides
/// by); the other strategies at each world above 1; DDP's no-sync twin and the bucketed all-reduce support the exposed-communication and
/// bus-bandwidth columns; the PyTorch peers mirror ours when `with_peers`. `sweep` (once, not
/// repeated, at the smallest world above one) is added by plan() when a projection was asked for.
std::vector<Measurement> measurements(const BenchConfig& config, bool with_peers);

struct Planned {
  Measurement measurement;
  int repeat = 0;  // -1: outside the repeats (the link sweep)
};

/// Every repeat runs every measurement once, odd repeats in reverse order.
std::vector<Planned> plan(const BenchConfig& config, bool with_peers);

/// The comma-separated flag values, checked: "small,large" -> {"small","large"}. Throws
/// tandem::Error naming `flag` and the allowed values.
std::vector<std::string> parse_list(const std::string& flag, const std::string& value,
                                    const std::vector<std::string>& allowed);
std::vector<int> parse_worlds(const std::string& value);

}  // namespace tandem::bench
