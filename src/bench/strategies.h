#pragma once
// Every measurement `tandem bench` knows, described once (Note [Strategy registry] in
// strategies.cpp). The plan, the analysis, the report, the plots, `tandem bench --help`, the
// runner and tandem-bench-worker's flag checks read this table; bench/peer.py's list is checked
// against it (bench.strategies.peer). Adding a strategy: docs/benchmarks.md, "Adding a strategy".
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::bench {

/// What a measurement is for.
enum class Role {
  Baseline,  // the one-device loop every ratio divides by: always measured, a row
  Compared,  // a row of the table, chosen with --strategies
  PeerOnly,  // PyTorch's alone (torch.nn.DataParallel): a row, no Tandem twin
  Support,   // measured for a row's figures, no row of its own (DDP's no_sync twin, its all-reduce)
  Link,      // the all-reduce sweep behind the projection (--project, --sweep)
};

/// How a measurement occupies its `world` devices.
enum class Launch {
  Alone,     // one process, one device
  Replicas,  // one process driving `world` devices (the workers' --replicas)
  Ranks,     // one process per device: a process group (a CPU backend, or NCCL)
};

/// The world sizes a measurement runs at, among --nproc's.
enum class Worlds {
  One,       // world 1 only
  AboveOne,  // each world above one (one device has no communication to time)
  Any,       // each world above one, and world 1 with --at-world-one (the wrapper's own cost)
};

/// What the record's timings are.
enum class Timing { Step, GradientAllReduce, Sweep };

/// How a CPU measurement's memory column counts (CUDA: each device's allocator peak).
enum class Memory {
  ProcessRss,         // each rank's peak RSS, LibTorch included
  ReplicaAccounting,  // the bytes of model state each replica holds (one process, several devices)
};

/// The runs a row's communication figures come from: exposed communication = the `synced` step
/// - the `no_sync` step, bus bandwidth from the `allreduce` measurement. Empty: none.
struct CommFigures {
  std::string synced, no_sync, allreduce;
  bool empty() const { return synced.empty(); }
};

struct Strategy {
  std::string name;          // --strategy, the records' "strategy"
  Role role = Role::Compared;
  bool by_default = true;    // Compared: in --strategies' default (else asked for by name)
  Launch launch = Launch::Ranks;
  Worlds worlds = Worlds::Any;
  Timing timing = Timing::Step;
  std::string summary;       // a few words: `tandem bench --help`
  std::string label;         // the table's label for Tandem's measurement
  std::string peer_label;    // the table's label for PyTorch's measurement of this name
  std::string what;          // the measurement in prose ("Accelerator step"), the "Gloo vs MPI" table
  std::string peer;          // the PyTorch measurement compared with ("": none)
  std::vector<std::string> peer_modules;  // what peer.py imports for it beside torch
  bool tandem = true;        // tandem-bench-worker measures it (else its record says why not)
  bool pytorch = false;      // bench/peer.py measures it (else its record says why not)
  CommFigures comm;          // measured beside it, at each world its rule allows
  std::vector<std::string> precisions{"fp32", "bf16", "fp16"};
  std::vector<std::string> backends;  // CPU backends (Ranks only; the PyTorch peers: Gloo)
  bool buckets = false;      // its record carries DDP's bucket layout
  bool model_state = false;  // its record carries each rank's accounted model state (params, grads, optimizer)
  Memory memory = Memory::ProcessRss;
  std::vector<std::string> models;  // the models it has a plan for (empty: every model)
  /// Tensor parallelism: 0 none; kTpWorld the whole world one TP group; n > 0 TP groups of n
  /// neighbouring ranks, FSDP across at least two of them (a 2-D mesh dp x tp). Its record carries
  /// the TP group's traffic per step (the row's communication).
  int tp_size = 0;
  /// Pipeline parallelism: "" none; else the schedule ("gpipe", "1f1b", "interleaved") of one
  /// pipeline over every rank, the GPT cut into one stage per rank (two, interleaved). Its record
  /// carries each stage's bubble and activation memory (Note [Pipeline measurements] in
  /// bench/worker.cpp).
  std::string pp_schedule;
  /// What `--strategies GROUP` stands for ("pp": every pipeline schedule); "" none.
  std::string group;
  std::string colour, colour_mpi;  // plots: Tandem's line (PyTorch's shares it) and its MPI twin's
};

constexpr int kTpWorld = -1;

/// Every strategy, in the table's order: the baseline, the compared ones, the peer-only ones,
/// then the supporting measurements.
const std::vector<Strategy>& strategies();

/// The entry named `name`, or nullptr (a record from another version of Tandem).
const Strategy* find_strategy(const std::string& name);
/// The entry named `name`; throws tandem::Error for a name the table lacks.
const Strategy& lookup_strategy(const std::string& name);
/// The one-device loop every ratio divides by ("single").
const Strategy& baseline();
/// The all-reduce sweep the projection fits its link to ("sweep").
const Strategy& link_sweep();

/// The names of the entries with one of `roles` (empty: every entry), in the table's order.
std::vector<std::string> strategy_names(const std::vector<Role>& roles);
/// What --strategies accepts: the baseline and the compared strategies.
std::vector<std::string> user_strategies();
/// --strategies' default: those of them with by_default.
std::vector<std::string> default_strategies();

/// Whether `strategy` runs as a process group of `world` ranks (and so on a CPU backend). A name
/// the table lacks is taken for one (records of a newer Tandem keep their backend).
bool multi_process(const std::string& strategy);

/// "gloo" or "mpi" for a multi-process strategy (old records without one: "gloo"), "" otherwise.
std::string normal_backend(const std::string& strategy, const std::string& backend);

/// The size of `s`'s tensor-parallel groups at `world` ranks (1: no tensor parallelism).
int tp_group_size(const Strategy& s, int world);
/// Pipeline stages per rank under `s`: 1, or 2 interleaved; 0 without a pipeline.
int pipeline_stages_per_rank(const Strategy& s);
/// The ranks that train one batch together at `world` ranks: a TP group, or the whole pipeline
/// (1: each rank its own batch). Such a group trains batch-per-device x its size samples a step.
int batch_group_size(const Strategy& s, int world);
/// The strategies `--strategies` accepts a group name for: {"pp": {"pp-gpipe", ...}}, in the
/// table's order.
std::vector<std::pair<std::string, std::vector<std::string>>> strategy_groups();
/// Why `s` cannot run `model` at `world` ranks by the table alone (a model without a plan, a mesh
/// the world does not make), or "". Both workers ask it (peer.py by the same rule).
std::string table_refusal(const Strategy& s, const std::string& model, int world);

/// The entry as JSON (enums by name): what `tandem-bench-worker --list-strategies` prints, one
/// line per entry, for the tests that hold the workers to this table.
nlohmann::json to_json(const Strategy& s);

/// The items separated by `separator` ("single, ddp" with ", ").
std::string join(const std::vector<std::string>& items, const std::string& separator);

}  // namespace tandem::bench
