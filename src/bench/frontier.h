#pragma once
// `tandem bench --memory-budget BYTES`: per strategy, the largest model of a GPT family that
// trains with every process under that memory budget, and its throughput (Note [Memory frontier]
// in frontier.cpp; docs/benchmarks.md, "Memory frontier").
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/runner.h"

namespace tandem::bench {

/// One model of the family: bench/workloads.h's GPT at this shape, `batch` sequences per process.
struct FamilyMember {
  int index = 0;
  std::string scale;
  int64_t vocab = 0, context = 0, dim = 0, layers = 0, heads = 0, batch = 0;
  std::string shape() const;  // "L4 d256"
};

/// The family of `scale` ("tiny": the tests', "cpu"): members 0 .. family_size-1, each larger.
int family_size(const std::string& scale);
FamilyMember family_member(const std::string& scale, int index);

/// What --memory-budget can measure: Tandem's strategies, and PyTorch's peer.
const std::vector<std::string>& frontier_strategies();
/// What it measures unless --strategies names others: the batch-parallel ones (tp and fsdp+tp by
/// name: each is another search of the family).
const std::vector<std::string>& frontier_default_strategies();
/// Why `strategy` cannot run the family of `scale` at `world` processes (tensor parallelism: the
/// heads, the vocabulary and the mesh must divide), or "".
std::string frontier_refusal(const std::string& strategy, const std::string& scale, int world);
constexpr const char* kFrontierPeer = "fsdp2-checkpoint";

/// "6442450944", "6G", "512M", "1536MiB" -> bytes (K, M, G: powers of 1024). Throws tandem::Error
/// for anything else, and for a budget under 128 MiB (a LibTorch process alone needs about that).
int64_t parse_memory_budget(const std::string& text);

/// A memory cgroup of our own under the first writable hierarchy: $TANDEM_MEMORY_CGROUP (a v1
/// memory mount or a v2 root), else /sys/fs/cgroup/memory (v1), else /sys/fs/cgroup (v2 with the
/// memory controller). Throws tandem::Error when there is none; removed (with its ranks' cgroups)
/// when destroyed.
class MemoryCgroup {
 public:
  MemoryCgroup();
  ~MemoryCgroup();
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;
  const std::string& root() const { return root_; }
  const std::string& limit_file() const { return limit_file_; }  // memory.limit_in_bytes or memory.max
  void remove_ranks() const;  // the rank cgroups of the last probe (its processes have exited)
  /// The largest charge any rank's cgroup reached (v1 memory.max_usage_in_bytes, v2 memory.peak;
  /// 0 where the kernel keeps none): read before remove_ranks.
  int64_t peak_charge() const;

 private:
  std::string root_, limit_file_;
};

struct FrontierConfig {
  int64_t budget = 0;
  int world = 4;
  std::string scale = "cpu";
  std::vector<std::string> strategies;  // among frontier_strategies()
  bool peer = false;                    // PyTorch's fsdp2-checkpoint too
  int steps = 3;
  double timeout_s = 600;
  std::string out;
};

/// One training run of one member under the budget.
struct Probe {
  int index = -1;
  bool fits = false;
  std::string failure;    // why not (killed for memory, or another failure), when it did not
  bool killed = false;    // failed because the cgroup's OOM killer stopped a rank
  int64_t peak_charge = 0;  // the largest rank's peak cgroup charge (MemoryCgroup::peak_charge)
  nlohmann::json record;  // the worker's record, when it fits
};

/// One strategy's result: the largest member that fits (largest.index -1: none), and the probe
/// of the member one larger (next.index == family size: the family's largest fits).
struct FrontierRow {
  std::string impl, strategy;
  Probe largest, next;
  std::vector<Probe> probes;  // in the order run
};

/// Runs the search for every strategy (and the peer), printing progress, and writes results.json,
/// results.md and frontier.png into config.out. Returns the process's exit status.
int run_memory_frontier(const Tools& tools, const FrontierConfig& config, const std::string& command);

/// results.md's table and notes from a frontier run's results.json content.
std::string render_frontier_markdown(const nlohmann::json& results);

/// `tandem report DIR` on a memory-frontier folder: its results.md (and frontier.png) drawn again
/// from its results.json; the markdown. Nothing, when DIR holds no frontier's results.json (the
/// comparison's reader then says what is wrong).
std::optional<std::string> rerender_frontier(const std::string& dir);

}  // namespace tandem::bench
