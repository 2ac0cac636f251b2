#include "bench/strategies.h"

#include <algorithm>

#include "tandem/error.h"

namespace tandem::bench {

// Note [Strategy registry]
// A strategy's knowledge used to be spread over the plan (what runs beside it), the summary (its
// peer, whether DDP's figures apply), the markdown (its label), the plots (its colour), the CLI
// (its help), the runner (how many processes) and both workers (their flag lists). Here it is
// one entry, and everything else reads it:
// - plan.cpp: which worlds and backends it runs at, its peer, and the runs its figures need
//   (`comm`: DDP's synced step, its no_sync twin and the bucketed all-reduce);
// - summary.cpp: the rows (Baseline, Compared, PeerOnly), each row's peer and communication;
// - markdown.cpp and plots.cpp: labels, prose and colours; recommend.cpp: the baseline;
// - runner.cpp and the CLI: processes or replicas, the sweep's arguments, --help, the peers'
//   Python modules;
// - bench/worker.cpp: the --strategy values it accepts, one process or ranks, precisions, how
//   memory is counted. bench/peer.py keeps its own list (it is Python); bench.strategies.peer
//   checks it against `tandem-bench-worker --list-strategies`, which prints this table.
// What stays outside: how each worker runs a strategy (its code), and the projection, which
// models DDP's buckets by name (Note [Projection from a run] in scaling.cpp).

namespace {

const CommFigures kDdpFigures{"ddp", "ddp-no-sync", "allreduce"};
const std::vector<std::string> kCpuBackends{"gloo", "mpi"};

std::vector<Strategy> make_table() {
  std::vector<Strategy> t;
  // An entry with the defaults, the others set where they differ (the reference is good until
  // the next add).
  auto add = [&](const std::string& name, Role role, Launch launch, Worlds worlds = Worlds::Any,
                 Timing timing = Timing::Step) -> Strategy& {
    Strategy& s = t.emplace_back();
    s.name = name;
    s.role = role;
    s.launch = launch;
    s.worlds = worlds;
    s.timing = timing;
    s.label = "Tandem " + name;
    s.peer_label = "PyTorch " + name;
    s.what = name + " step";
    if (launch == Launch::Ranks) s.backends = kCpuBackends;
    return s;
  };
  Strategy& single = add("single", Role::Baseline, Launch::Alone, Worlds::One);
  single.summary = "one device, a plain loop (the baseline)";
  single.peer = "single";
  single.pytorch = true;
  single.colour = "#555555";

  for (const char* mode : {"dp-replicate", "dp-persistent"}) {
    Strategy& dp = add(mode, Role::Compared, Launch::Replicas);
    const bool replicate = dp.name == "dp-replicate";
    dp.summary = replicate ? "DataParallel, replicas copied every step (PyTorch's semantics)"
                           : "DataParallel, persistent replicas";
    dp.peer = "dp";
    dp.memory = Memory::ReplicaAccounting;
    dp.colour = replicate ? "#E69F00" : "#CC79A7";
  }

  // DDP underneath: both workers measure it under its own name, its rows carry DDP's
  // communication figures, its record DDP's buckets.
  auto over_ddp = [&](const std::string& name, const std::string& summary) -> Strategy& {
    Strategy& s = add(name, Role::Compared, Launch::Ranks);
    s.summary = summary;
    s.peer = name;
    s.pytorch = true;
    s.comm = kDdpFigures;
    s.buckets = true;
    return s;
  };
  Strategy& ddp = over_ddp("ddp", "DistributedDataParallel");
  ddp.model_state = true;
  ddp.colour = "#0072B2";
  ddp.colour_mpi = "#56B4E9";

  Strategy& accelerate = over_ddp("accelerate", "the Accelerator (strategy Ddp; HF accelerate's loop for the peer)");
  accelerate.label = "Tandem Accelerator";
  accelerate.peer_label = "HF accelerate";
  accelerate.what = "Accelerator step";
  accelerate.peer_modules = {"accelerate"};
  accelerate.colour = "#009E73";
  accelerate.colour_mpi = "#882255";

  // Not in the default run: it is about memory, and the table's other columns would only show its
  // exchange's cost (docs/guide-zero.md). fp16 would need the GradScaler's cross-rank check in the
  // workers' plain loop, which neither has.
  Strategy& zero1 = over_ddp("zero1", "DDP with ZeRO-1: each rank keeps the optimizer state of its share");
  zero1.by_default = false;
  zero1.precisions = {"fp32", "bf16"};
  zero1.model_state = true;
  zero1.colour = "#117733";
  zero1.colour_mpi = "#44AA99";

  // ZeRO-2 has no PyTorch counterpart to run here: ZeroRedundancyOptimizer is stage 1, and FSDP's
  // SHARD_GRAD_OP is another design (flat parameters, CUDA-first).
  Strategy& zero2 = over_ddp("zero2", "DDP with ZeRO-2: gradients reduce-scattered, each rank keeps and steps its slices");
  zero2.by_default = false;
  zero2.peer = "";
  zero2.pytorch = false;
  zero2.precisions = {"fp32", "bf16"};
  zero2.model_state = true;
  zero2.colour = "#999933";
  zero2.colour_mpi = "#DDCC77";

  // Fully sharded (ZeRO-3): every Sequential entry a unit (the large model's blocks), the rest the
  // root unit; PyTorch's FSDP2 (fully_shard on the same modules) is the peer, on CPU/Gloo too.
  Strategy& fsdp = add("fsdp", Role::Compared, Launch::Ranks);
  fsdp.summary = "FullyShardedDataParallel: parameters, gradients and optimizer state sharded (ZeRO-3)";
  fsdp.label = "Tandem FSDP";
  fsdp.peer = "fsdp";
  fsdp.peer_label = "PyTorch FSDP2";
  fsdp.pytorch = true;
  fsdp.by_default = false;
  fsdp.precisions = {"fp32", "bf16"};
  fsdp.model_state = true;
  fsdp.colour = "#882255";
  fsdp.colour_mpi = "#CC6677";

  // Tensor parallelism on the GPT (gpt_tp_plan in bench/workloads.h, the loss vocab-parallel); each
  // TP group trains one batch of batch-per-device x its size (the same samples per device as the
  // others, so samples/s compare). PyTorch's parallelize_module (DTensor, on Gloo too) is the peer.
  // Communication: the TP group's collectives, counted and timed per step (Note [TP traffic] in
  // bench/worker.cpp).
  Strategy& tp = add("tp", Role::Compared, Launch::Ranks);
  tp.summary = "tensor parallelism: every layer of the GPT cut over all ranks (Megatron's plan), one batch";
  tp.label = "Tandem TP";
  tp.peer = "tp";
  tp.peer_label = "PyTorch TP";
  tp.pytorch = true;
  tp.by_default = false;
  tp.precisions = {"fp32", "bf16"};
  tp.model_state = true;
  tp.models = {"large"};
  tp.tp_size = kTpWorld;
  tp.colour = "#661100";
  tp.colour_mpi = "#AA4466";

  Strategy& fsdp_tp = add("fsdp+tp", Role::Compared, Launch::Ranks, Worlds::AboveOne);
  fsdp_tp.summary = "FSDP across tensor-parallel pairs: a 2-D mesh (world/2 x tp 2), the GPT only";
  fsdp_tp.label = "Tandem FSDP+TP";
  fsdp_tp.peer = "fsdp+tp";
  fsdp_tp.peer_label = "PyTorch FSDP2+TP";
  fsdp_tp.pytorch = true;
  fsdp_tp.by_default = false;
  fsdp_tp.precisions = {"fp32", "bf16"};
  fsdp_tp.model_state = true;
  fsdp_tp.models = {"large"};
  fsdp_tp.tp_size = 2;
  fsdp_tp.colour = "#6699CC";
  fsdp_tp.colour_mpi = "#004488";

  // Pipeline parallelism: one pipeline over every rank, the GPT cut by blocks into a stage per rank
  // (two interleaved), one batch of batch-per-device x ranks in 2 x ranks microbatches (tandem
  // bench --microbatches). PyTorch's torch.distributed.pipelining (PipelineStage and the schedule
  // of the same name, on Gloo too) is the peer. Figures beside the step: each stage's bubble,
  // measured and in theory, and the activations it held at once (Note [Pipeline measurements] in
  // bench/worker.cpp). fp16 would need the loss scale in every stage: refused, as the Accelerator does.
  struct PipelineEntry {
    const char *name, *schedule, *title, *summary, *colour, *colour_mpi;
  };
  for (const PipelineEntry& e : {
           PipelineEntry{"pp-gpipe", "gpipe", "GPipe", "pipeline parallelism, GPipe: every microbatch forward, then every backward",
                         "#44AA99", "#117733"},
           PipelineEntry{"pp-1f1b", "1f1b", "1F1B", "pipeline parallelism, 1F1B: one forward, one backward, the same bubble in less memory",
                         "#DDCC77", "#999933"},
           PipelineEntry{"pp-interleaved", "interleaved", "interleaved 1F1B",
                         "pipeline parallelism, interleaved 1F1B: two stages per rank, a smaller bubble for more messages",
                         "#CC6677", "#882255"}}) {
    Strategy& s = add(e.name, Role::Compared, Launch::Ranks, Worlds::AboveOne);
    s.summary = e.summary;
    s.label = std::string("Tandem PP ") + e.title;
    s.peer = e.name;
    s.peer_label = std::string("PyTorch PP ") + e.title;
    s.pytorch = true;
    s.by_default = false;
    s.precisions = {"fp32", "bf16"};
    s.models = {"large"};
    s.pp_schedule = e.schedule;
    s.group = "pp";
    s.colour = e.colour;
    s.colour_mpi = e.colour_mpi;
  }

  // The Accelerator's loop with its zero_stage option: what a user of tandem::Accelerator runs.
  // accelerate's own ZeRO is DeepSpeed's plugin, which needs DeepSpeed: no peer here either.
  for (const char* stage : {"1", "2"}) {
    Strategy& s = over_ddp(std::string("accelerate-zero") + stage,
                           std::string("the Accelerator with zero_stage(") + stage + ")");
    s.label = std::string("Tandem Accelerator ZeRO-") + stage;
    s.what = "Accelerator step";
    s.by_default = false;
    s.peer = "";
    s.pytorch = false;
    s.precisions = {"fp32", "bf16"};
    s.colour = stage[0] == '1' ? "#AA4499" : "#332288";
    s.colour_mpi = stage[0] == '1' ? "#CC6677" : "#6699CC";
  }

  Strategy& dp = add("dp", Role::PeerOnly, Launch::Replicas);
  dp.summary = "torch.nn.DataParallel";
  dp.peer_label = "torch.nn.DataParallel";
  dp.tandem = false;
  dp.pytorch = true;
  dp.memory = Memory::ReplicaAccounting;
  dp.colour = "#D55E00";

  Strategy& no_sync = add("ddp-no-sync", Role::Support, Launch::Ranks, Worlds::AboveOne);
  no_sync.summary = "DDP with every step under no_sync: its step without communication";
  no_sync.peer = "ddp-no-sync";
  no_sync.pytorch = true;
  no_sync.buckets = true;

  Strategy& allreduce = add("allreduce", Role::Support, Launch::Ranks, Worlds::AboveOne, Timing::GradientAllReduce);
  allreduce.summary = "the gradient's bytes all-reduced in DDP's buckets, without a model";
  allreduce.what = "gradient all-reduce (DDP's buckets)";
  allreduce.buckets = true;

  Strategy& sweep = add("sweep", Role::Link, Launch::Ranks, Worlds::AboveOne, Timing::Sweep);
  sweep.summary = "all-reduces of float32 buffers, x4 apart: the link's latency and bandwidth";
  return t;
}

}  // namespace

const std::vector<Strategy>& strategies() {
  static const std::vector<Strategy> table = make_table();
  return table;
}

const Strategy* find_strategy(const std::string& name) {
  const auto& all = strategies();
  auto it = std::find_if(all.begin(), all.end(), [&](const Strategy& s) { return s.name == name; });
  return it == all.end() ? nullptr : &*it;
}

const Strategy& lookup_strategy(const std::string& name) {
  const Strategy* s = find_strategy(name);
  TANDEM_CHECK(s, "unknown benchmark strategy '", name, "' (expected one of ", join(strategy_names({}), ", "), ")");
  return *s;
}

namespace {

// The entry with `role`, which the table has exactly one of.
const Strategy& the_one(Role role) {
  const auto& all = strategies();
  return *std::find_if(all.begin(), all.end(), [&](const Strategy& s) { return s.role == role; });
}

}  // namespace

const Strategy& baseline() { return the_one(Role::Baseline); }
const Strategy& link_sweep() { return the_one(Role::Link); }

std::vector<std::string> strategy_names(const std::vector<Role>& roles) {
  std::vector<std::string> out;
  for (const auto& s : strategies()) {
    if (roles.empty() || std::find(roles.begin(), roles.end(), s.role) != roles.end()) out.push_back(s.name);
  }
  return out;
}

std::vector<std::string> user_strategies() { return strategy_names({Role::Baseline, Role::Compared}); }

std::vector<std::string> default_strategies() {
  std::vector<std::string> out;
  for (const auto& name : user_strategies()) {
    if (lookup_strategy(name).by_default) out.push_back(name);
  }
  return out;
}

bool multi_process(const std::string& strategy) {
  const Strategy* s = find_strategy(strategy);
  return !s || s->launch == Launch::Ranks;
}

std::string normal_backend(const std::string& strategy, const std::string& backend) {
  if (!multi_process(strategy)) return "";
  return backend.empty() ? "gloo" : backend;
}

int tp_group_size(const Strategy& s, int world) {
  if (s.tp_size == kTpWorld) return world;
  return s.tp_size > 0 ? s.tp_size : 1;
}

int pipeline_stages_per_rank(const Strategy& s) {
  if (s.pp_schedule.empty()) return 0;
  return s.pp_schedule == "interleaved" ? 2 : 1;
}

int batch_group_size(const Strategy& s, int world) { return s.pp_schedule.empty() ? tp_group_size(s, world) : world; }

std::vector<std::pair<std::string, std::vector<std::string>>> strategy_groups() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& s : strategies()) {
    if (s.group.empty()) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& g) { return g.first == s.group; });
    if (it == out.end()) it = out.insert(out.end(), {s.group, {}});
    it->second.push_back(s.name);
  }
  return out;
}

std::string table_refusal(const Strategy& s, const std::string& model, int world) {
  if (!s.models.empty() && std::find(s.models.begin(), s.models.end(), model) == s.models.end()) {
    return s.name + " has a plan for the " + join(s.models, ", ") + " model only, not " + model;
  }
  if (s.tp_size > 0 && (world % s.tp_size != 0 || world / s.tp_size < 2)) {
    return s.name + " needs a 2-D mesh of at least two tensor-parallel groups of " + std::to_string(s.tp_size) +
           ": a multiple of " + std::to_string(s.tp_size) + " ranks, at least " + std::to_string(2 * s.tp_size) +
           " (got " + std::to_string(world) + ")";
  }
  if (!s.pp_schedule.empty() && world < 2) {
    return s.name + " is a pipeline of a stage per rank: it needs at least 2 ranks (got " + std::to_string(world) + ")";
  }
  return "";
}

nlohmann::json to_json(const Strategy& s) {
  static const char* roles[] = {"baseline", "compared", "peer-only", "support", "link"};
  static const char* launches[] = {"alone", "replicas", "ranks"};
  static const char* worlds[] = {"one", "above-one", "any"};
  static const char* timings[] = {"step", "gradient-allreduce", "sweep"};
  static const char* memories[] = {"rss", "replica"};
  return {{"name", s.name},
          {"role", roles[static_cast<int>(s.role)]},
          {"launch", launches[static_cast<int>(s.launch)]},
          {"worlds", worlds[static_cast<int>(s.worlds)]},
          {"timing", timings[static_cast<int>(s.timing)]},
          {"summary", s.summary},
          {"label", s.label},
          {"peer_label", s.peer_label},
          {"peer", s.peer},
          {"peer_modules", s.peer_modules},
          {"tandem", s.tandem},
          {"pytorch", s.pytorch},
          {"comm", {{"synced", s.comm.synced}, {"no_sync", s.comm.no_sync}, {"allreduce", s.comm.allreduce}}},
          {"precisions", s.precisions},
          {"backends", s.backends},
          {"buckets", s.buckets},
          {"model_state", s.model_state},
          {"by_default", s.by_default},
          {"memory", memories[static_cast<int>(s.memory)]},
          {"models", s.models},
          {"tp_size", s.tp_size},
          {"pp_schedule", s.pp_schedule},
          {"group", s.group}};
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

}  // namespace tandem::bench
