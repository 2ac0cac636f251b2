#pragma once
// What `tandem bench` measures: the configuration the user asked for, and the plan it becomes —
// every measurement of every repeat, interleaved (Note [Interleaving] in plan.cpp).
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench/strategies.h"

namespace tandem::bench {

/// The flags of `tandem bench`, after parsing. Defaults are the 10-minute run on 2 CPU cores.
struct BenchConfig {
  std::vector<std::string> models{"small", "medium", "large"};
  std::vector<std::string> strategies = default_strategies();
  std::vector<int> worlds{1, 2};           // --nproc: world sizes (devices)
  std::string precision = "fp32";
  std::string device = "cpu";
  std::string scale = "cpu";               // model presets: tiny (tests), cpu, full
  std::map<std::string, int> batch_sizes{{"small", 64}, {"medium", 32}, {"large", 8}};  // per device
  int steps = 10, warmup = 3, repeats = 3, threads = 1;
  double min_seconds = 1.0;                // timed steps per measurement: at least --steps, and this long
  std::string peers = "auto";              // auto (when the Python has them), on, off
  std::string python;                      // the interpreter for the PyTorch peers
  std::vector<std::string> project;        // --project shapes, e.g. "8x1", "8x4"
  std::string link_intra = "measured", link_inter = "ib100";
  std::vector<std::string> backends{"gloo"};  // --backends: CPU collectives' engines (Note [Backends])
  bool sweep = false;                      // --sweep: the all-reduce sweep at every world above one
  bool at_world_one = false;               // --at-world-one: every strategy at world 1 too (one device)
  int64_t sweep_min_bytes = 4096, sweep_max_bytes = int64_t{64} << 20;  // float32 buffers, x4 apart
  int microbatches = 0;                    // --microbatches: a pipeline's per step (0: twice its ranks)
};

/// One measurement: a process group running one worker (ours or PyTorch's) once.
struct Measurement {
  Measurement() = default;
  Measurement(std::string impl_, std::string model_, std::string strategy_, int world_, std::string backend_ = "")
      : impl(std::move(impl_)), model(std::move(model_)), strategy(std::move(strategy_)), world(world_),
        backend(std::move(backend_)) {}

  std::string impl;      // "tandem" | "pytorch"
  std::string model;
  std::string strategy;  // a user strategy, or the supporting "ddp-no-sync", "allreduce", "sweep"
  int world = 1;
  std::string backend;   // multi-process: "gloo" | "mpi" (PyTorch: always "gloo"); one process: ""
  bool operator==(const Measurement& o) const {
    return impl == o.impl && model == o.model && strategy == o.strategy && world == o.world &&
           backend == o.backend;
  }
};

/// What runs once per repeat, read from the strategy table (strategies.h): the baseline at world
/// 1, always (every ratio divides by it); each chosen strategy at the worlds its rule allows,
/// followed by the runs its communication figures need (DDP's synced step, its no_sync twin and
/// the bucketed all-reduce, each at the worlds its own rule allows); each with its PyTorch peer
/// when `with_peers`. The link sweep (once, not repeated) is added by plan(). Tandem's
/// multi-process measurements run once per backend of `config.backends` the strategy supports;
/// the PyTorch peers always on Gloo (the wheel has no MPI); one-process ones once, with no backend.
std::vector<Measurement> measurements(const BenchConfig& config, bool with_peers);

struct Planned {
  Measurement measurement;
  int repeat = 0;  // -1: outside the repeats (the link sweep)
};

/// Every repeat runs every measurement once, odd repeats in reverse order. The sweeps (repeat -1)
/// come first: one per backend, at the smallest world above one for --project, at every world
/// above one for --sweep.
std::vector<Planned> plan(const BenchConfig& config, bool with_peers);

/// The comma-separated flag values, checked: "small,large" -> {"small","large"}. Throws
/// tandem::Error naming `flag` and the allowed values.
std::vector<std::string> parse_list(const std::string& flag, const std::string& value,
                                    const std::vector<std::string>& allowed);
/// --strategies: the user strategies (strategies.h), a group name standing for its members
/// ("pp": every pipeline schedule), deduplicated in the order given. Throws as parse_list.
std::vector<std::string> parse_strategies(const std::string& value);
std::vector<int> parse_worlds(const std::string& value);
/// --backends: gloo and/or mpi, checked against the device (CPU only: CUDA tensors go through
/// NCCL) and this build (`mpi_built`: TANDEM_BUILT_WITH_MPI). Throws tandem::Error saying why.
std::vector<std::string> parse_backends(const std::string& value, const std::string& device, bool mpi_built);
/// --sweep-min-bytes / --sweep-max-bytes: multiples of 4 (float32), min <= max <= 4 GiB.
void check_sweep_sizes(int64_t min_bytes, int64_t max_bytes);

}  // namespace tandem::bench
