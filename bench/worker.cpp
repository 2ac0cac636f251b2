// tandem-bench-worker: one measurement of Tandem, run as every rank of a `tandem run` job (or
// alone, as a world of one). `tandem bench` starts it; bench/peer.py is its PyTorch twin: the
// same flags, the same models (bench/workloads.h), the same record.
//
//   tandem-bench-worker --model small|medium|large --scale tiny|cpu|full --strategy S
//                       [--batch-size B] [--steps N] [--warmup K] [--min-seconds S] [--threads T]
//                       [--precision fp32|bf16|fp16] [--device cpu|cuda] [--replicas R]
//                       [--sweep-min-bytes N] [--sweep-max-bytes N]
//                       [--sweep-collective all_reduce|reduce_scatter|all_gather] [--microbatches M]
//                       [--out FILE]
//
// Strategies: single (plain loop, world 1), ddp (DistributedDataParallel, synced every step),
// ddp-no-sync (DDP with every step under no_sync: compute without communication), zero1, zero2
// (DDP with ZeRO-1 or ZeRO-2 over the same SGD), fsdp (FullyShardedDataParallel), tp and fsdp+tp
// (tensor parallelism on the GPT over every rank, or over pairs with FSDP across them: Note [TP
// traffic]), pp-gpipe, pp-1f1b, pp-interleaved (one pipeline of the GPT over every rank, M
// microbatches, 2 x ranks by default: Note [Pipeline measurements]), accelerate-zero1/2 (the
// Accelerator's zero_stage), accelerate (tandem::Accelerator, strategy Ddp), dp-replicate /
// dp-persistent (tandem::dp::DataParallel over R replicas in one process), allreduce (the model's
// gradient bytes all-reduced through the process group, in DDP's bucket layout and flat), sweep
// (all_reduce of float32 buffers from --sweep-min-bytes, 4 KiB by default, x4 apart up to
// --sweep-max-bytes, 64 MiB by default; by hand, --sweep-collective times ZeRO's reduce-scatter
// or all-gather of such a buffer instead).
// `dp` (torch.nn.DataParallel) is the peer's alone. The values and what each is (one process or
// ranks, precisions, memory counting) come from the strategy table, src/bench/strategies.h;
// --list-strategies prints it. The CPU collectives run on the backend
// TANDEM_CPU_BACKEND or the launcher chose (`tandem run --backend gloo|mpi`); the record's
// "backend" names the one the process group really used.
//
// Every step: zero_grad, forward + loss (under autocast for bf16/fp16), backward (the loss
// scaled by a GradScaler for fp16), optimizer step (SGD lr 0.01 momentum 0.9). One synthetic
// batch per rank (seed 100 + rank) is made once and reused. Rank 0 gathers every rank's
// numbers and writes ONE JSON line (record "tandem-bench-run/1") to --out (appended) or stdout.
// A combination that cannot run gives the "unsupported" record and exit 0 on every rank; bad
// flags one line on stderr and exit 2; a failure during the run one line and exit 1.
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/optim/sgd.h>

#include "bench/strategies.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/amp/autocast.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/comm/cuda_info.h"
#include "tandem/comm/device_mesh.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/dp/data_parallel.h"
#include "tandem/error.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/host_allocator.h"
#include "tandem/pp/schedule.h"
#include "tandem/tp/loss_parallel.h"
#include "tandem/tp/parallelize.h"
#include "tandem/version.h"
#include "tandem/zero/gradient_sharded_optimizer.h"
#include "tandem/zero/sharded_optimizer.h"
#include "tandem/zero/state_bytes.h"
#include "workloads.h"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

using namespace tandem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

namespace {

constexpr const char* kRecord = "tandem-bench-run/1";

struct Options {
  std::string model = "small", scale = "cpu", strategy = "ddp", precision = "fp32", device = "cpu", out;
  int64_t batch = 32;
  int steps = 20, warmup = 3, threads = 1, replicas = 2;
  double min_seconds = 0;  // the timed steps last at least this long: more steps than --steps if short
  int64_t sweep_min_bytes = 4096, sweep_max_bytes = int64_t{64} << 20;
  std::string sweep_collective = "all_reduce";  // or reduce_scatter, all_gather (ZeRO's)
  int microbatches = 0;  // pp-*: per step (0: twice the ranks)

  bool cuda() const { return device == "cuda"; }
  /// pp-*: a step's microbatches at `ranks` ranks.
  int microbatches_at(int ranks) const { return microbatches > 0 ? microbatches : 2 * ranks; }
  const bench::Strategy& entry() const { return bench::lookup_strategy(strategy); }
  /// One process driving --replicas devices (DataParallel).
  bool dp() const { return entry().launch == bench::Launch::Replicas; }
};

// ---- timing ------------------------------------------------------------------------------------

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// Linear-interpolated percentile (numpy's default), p in [0, 1].
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

void cuda_synchronize() {
#ifdef TANDEM_HAVE_CUDA
  c10::cuda::device_synchronize();
#endif
}

int64_t cuda_peak_bytes(int device) {
#ifdef TANDEM_HAVE_CUDA
  using c10::CachingDeviceAllocator::StatType;
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
#else
  (void)device;
  return 0;
#endif
}

/// The CUDA allocator's bytes on `device` now, its peak since then reset to them.
int64_t cuda_reset_peak(int device) {
#ifdef TANDEM_HAVE_CUDA
  using c10::CachingDeviceAllocator::StatType;
  const auto index = static_cast<c10::DeviceIndex>(device);
  c10::cuda::CUDACachingAllocator::resetPeakStats(index);
  return c10::cuda::CUDACachingAllocator::getDeviceStats(index).allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current;
#else
  (void)device;
  return 0;
#endif
}

/// Minor page faults of the whole process so far (Note [Host allocator]: a step that reuses its
/// memory faults nothing).
int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_minflt);
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux: KiB
}

/// warmup + steps iterations of a step; the timed ones' durations, and their phases'. On CUDA
/// every phase and step ends with a device synchronize, so the times are the device's. With
/// --min-seconds, the ranks agree after the warm-up on enough steps to fill that time (a 4 ms
/// step measured 10 times is mostly noise), from the slowest rank's last warm-up step.
struct Loop {
  const Options& o;
  comm::ProcessGroup* pg;  // the ranks that agree on --min-seconds' count; null: exactly --steps
  std::vector<double> times, forward, backward, optimizer;
  double faults_per_step = 0;  // the process's minor page faults over the timed steps, per step
  int steps = 0;               // timed steps run
  bool timed = false;

  explicit Loop(const Options& options, comm::ProcessGroup* group = nullptr) : o(options), pg(group) {}
  void sync() const {
    if (o.cuda()) cuda_synchronize();
  }
  template <typename F>
  void phase(std::vector<double>& into, F&& f) {
    const auto start = Clock::now();
    f();
    sync();
    if (timed) into.push_back(seconds_since(start));
  }
  template <typename Step>
  void run(Step&& step) {
    double last_warmup = 0;
    for (int i = 0; i < o.warmup; ++i) {
      const auto start = Clock::now();
      step();
      sync();
      last_warmup = seconds_since(start);
    }
    steps = timed_steps(last_warmup);
    timed = true;
    const int64_t faults_before = minor_faults();
    for (int i = 0; i < steps; ++i) {
      const auto start = Clock::now();
      step();
      sync();
      times.push_back(seconds_since(start));
    }
    if (steps > 0) faults_per_step = static_cast<double>(minor_faults() - faults_before) / steps;
    timed = false;
  }

 private:
  int timed_steps(double step_seconds) const {
    if (o.min_seconds <= 0 || o.warmup == 0 || !pg) return o.steps;
    if (pg->size() > 1) {
      at::Tensor slowest = at::tensor({step_seconds}, at::kDouble);
      pg->all_reduce(slowest, comm::ReduceOp::Max);
      step_seconds = slowest.item<double>();
    }
    // At most 100,000 steps for the time (a step of a microsecond), never fewer than --steps.
    const double wanted = std::min(std::ceil(o.min_seconds / std::max(step_seconds, 1e-6)), 100000.0);
    return std::max(o.steps, static_cast<int>(wanted));
  }
};

// ---- what one measurement produces -------------------------------------------------------------

struct Result {
  std::vector<double> times, forward, backward, optimizer;
  std::vector<double> exposed_gather, exposed_reduce_scatter;  // fsdp: host time blocked per timed step
  std::vector<double> tp_wait, tp_bytes, tp_collectives;       // tp: the TP group's traffic per timed step
  std::vector<double> pp_bubble;         // pp-*: this rank's share of each timed step blocked on a neighbour
  int64_t pp_activation_bytes = -1;      // pp-*: the most a step held at once beyond its start
  double faults_per_step = 0;
  int steps = 0;
  int64_t params = 0, grad_bytes = 0, buckets = 0;
  std::vector<int64_t> bucket_bytes;  // DDP's buckets in launch order (the projection's input)
  std::vector<int64_t> replica_bytes;  // dp-* on CPU: memory_report() totals
  std::optional<std::array<int64_t, 3>> model_state;  // this rank's parameter, gradient, optimizer-state bytes
  std::optional<std::array<int64_t, 2>> transient;    // fsdp: the peak a step adds, and two largest units' bytes
  std::vector<int64_t> device_bytes;   // dp-* on CUDA: each device's allocator peak
  std::optional<double> allreduce_p50, flat_allreduce_p50;
  std::optional<Json> sweep;

  void take(Loop& loop) {
    times = std::move(loop.times);
    forward = std::move(loop.forward);
    backward = std::move(loop.backward);
    optimizer = std::move(loop.optimizer);
    faults_per_step = loop.faults_per_step;
    steps = loop.steps;
  }
};

std::optional<at::ScalarType> autocast_dtype(const Options& o) {
  if (o.precision == "bf16") return at::kBFloat16;
  if (o.precision == "fp16") return at::kHalf;
  return std::nullopt;
}

c10::DeviceType device_type(const Options& o) { return o.cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU; }

/// Autocast to --precision's dtype while the result lives (nothing for fp32).
std::optional<amp::AutocastScope> autocast_scope(const Options& o) {
  if (auto dtype = autocast_dtype(o)) return std::optional<amp::AutocastScope>(std::in_place, device_type(o), *dtype);
  return std::nullopt;
}

torch::optim::SGD make_sgd(std::vector<at::Tensor> params) {
  return torch::optim::SGD(std::move(params), torch::optim::SGDOptions(0.01).momentum(0.9));
}

/// What a plain loop steps: a whole optimizer, or one sharded by ZeRO-1 or ZeRO-2.
struct Stepper {
  Stepper(torch::optim::Optimizer& o, zero::ShardedOptimizer* z = nullptr, zero::GradientShardedOptimizer* f = nullptr)
      : optimizer(o), sharded(z), flat(f) {}
  void zero_grad() { sharded ? sharded->zero_grad() : flat ? flat->zero_grad() : optimizer.zero_grad(); }
  void step(amp::GradScaler* scaler) {
    auto step_with = [scaler](torch::optim::Optimizer& opt) { return amp::step_optimizer(opt, scaler); };
    if (sharded) {
      sharded->step(step_with);
    } else if (flat) {
      flat->step(step_with);
    } else {
      step_with(optimizer);
    }
    if (scaler) scaler->update();
  }
  torch::optim::Optimizer& optimizer;
  zero::ShardedOptimizer* sharded;
  zero::GradientShardedOptimizer* flat;
};

using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

/// One training step of a plain loop (single, ddp, ddp-no-sync, zero1, zero2, fsdp, tp, dp-*): zero_grad,
/// forward and loss under autocast, backward (scaled for fp16), step. `forward` runs the model on the
/// batch; `loss_of` (the models' cross entropy unless given) turns its output into the loss.
template <typename Forward>
void plain_step(const Options& o, Loop& loop, Stepper opt, amp::GradScaler* scaler, const at::Tensor& y,
                Forward&& forward, const LossFn& loss_of = bench::loss_of) {
  opt.zero_grad();
  at::Tensor loss;
  loop.phase(loop.forward, [&] {
    const auto autocast = autocast_scope(o);
    loss = loss_of(forward(), y);
  });
  loop.phase(loop.backward, [&] {
    if (scaler) {
      scaler->scale(loss).backward();
    } else {
      loss.backward();
    }
  });
  loop.phase(loop.optimizer, [&] { opt.step(scaler); });
}

/// The worker's FSDP (fsdp, fsdp+tp): every Sequential entry a unit (the large model's blocks), the
/// rest the root unit. Under bf16/fp16 the units gather, compute and reduce in it, as the
/// Accelerator and the peer's FSDP2 do.
fsdp::FullyShardOptions fsdp_options(const Options& o) {
  const auto low = autocast_dtype(o);
  return fsdp::FullyShardOptions()
      .auto_wrap(fsdp::AutoWrapPolicy())
      .mixed_precision(fsdp::MixedPrecisionPolicy().param_dtype(low).reduce_dtype(low));
}

std::optional<amp::GradScaler> make_scaler(const Options& o) {
  // No process group: torch.amp.GradScaler (the peer's) does not all-reduce found-inf either.
  if (o.precision == "fp16") return std::make_optional<amp::GradScaler>();
  return std::nullopt;
}

// This rank's model state by kind, accounted from the tensors: parameters, the gradients a step
// materialises (every trainable parameter's, under DDP and ZeRO-1 alike: ZeRO-1 drops the ones
// it does not own only after the step; ZeRO-2's kept slices are set by the caller), and the
// optimizer's state (only its share under ZeRO).
std::array<int64_t, 3> model_state_bytes(torch::nn::Module& net, const torch::optim::Optimizer& opt) {
  std::array<int64_t, 3> bytes{0, 0, zero::optimizer_state_bytes(opt)};
  for (const auto& p : net.parameters()) {
    bytes[0] += static_cast<int64_t>(p.nbytes());
    if (p.requires_grad()) bytes[1] += static_cast<int64_t>(p.nbytes());
  }
  return bytes;
}

// DDP's buckets in float32 bytes, in the order the reducer launches them.
template <typename Model>
std::vector<int64_t> bucket_layout(Model& model) {
  std::vector<int64_t> out;
  const auto& params = model.reducer().parameters();
  for (const auto& bucket : model.reducer().buckets()) {
    int64_t bytes = 0;
    for (size_t index : bucket.parameters) bytes += params[index].numel() * 4;
    out.push_back(bytes);
  }
  return out;
}

// Note [Pipeline measurements]
// pp-*: one pipeline over every rank (P of them), the GPT cut by pp::stage_blocks into P stages
// (2P interleaved: stages r and r + P on rank r), training one batch of B x P samples (the same on
// every rank: stage 0 reads its tokens, the last stage its targets) in m microbatches
// (--microbatches; 2P by default, a multiple of P as interleaved needs). Each timed step records
// the share of it this rank was blocked on a neighbour, Schedule::last_step().bubble(): the bubble
// as the rank saw it, which an ideal pipeline of equal stages puts at (P - 1) / (v m + P - 1).
// Then a few untimed steps of a second schedule over the same stages with track_memory (its
// counting allocator takes a lock per allocation, so no timed step runs under it) give the most
// bytes a step held at once beyond those alive when it began: the activations kept for backward,
// the messages in flight and backward's transients. On CUDA the device allocator's peak over the
// step, less its bytes at the step's start, stands for that count.
void measure_pipeline(const Options& o, const comm::World& world, const std::shared_ptr<comm::ProcessGroup>& pg,
                      bench::Gpt& net, const at::Tensor& x, const at::Tensor& y, Loop& loop, Result& r) {
  const bench::Strategy& entry = o.entry();
  const int P = world.world_size, stages = P * bench::pipeline_stages_per_rank(entry);
  const int m = o.microbatches_at(P);
  std::vector<bench::GptStage> modules;
  std::vector<std::unique_ptr<pp::Stage>> owned;
  std::vector<pp::Stage*> mine;
  std::vector<at::Tensor> parameters;
  for (int s = world.rank; s < stages; s += P) {
    modules.push_back(bench::GptStage(net, s, stages));
    // Under bf16 each forward (and loss) autocasts; the backwards, which the schedule runs in the
    // same step, do not (as plain_step's).
    auto forward = [&o, stage = modules.back().ptr()](const at::Tensor& in) {
      const auto autocast = autocast_scope(o);
      return stage->forward(in);
    };
    owned.push_back(std::make_unique<pp::Stage>(modules.back().ptr(), forward, s, stages, pg));
    mine.push_back(owned.back().get());
    for (const auto& p : modules.back()->parameters()) parameters.push_back(p);
  }
  auto make_schedule = [&](bool track_memory) -> std::unique_ptr<pp::Schedule> {
    const auto options = pp::ScheduleOptions().track_memory(track_memory);
    const pp::LossFn loss = [&o](const at::Tensor& output, const at::Tensor& target) {
      const auto autocast = autocast_scope(o);
      return bench::loss_of(output, target);
    };
    if (entry.pp_schedule == "gpipe") return std::make_unique<pp::ScheduleGPipe>(*mine.front(), m, loss, options);
    if (entry.pp_schedule == "1f1b") return std::make_unique<pp::Schedule1F1B>(*mine.front(), m, loss, options);
    return std::make_unique<pp::ScheduleInterleaved1F1B>(mine, m, loss, options);
  };
  auto opt = make_sgd(parameters);
  const at::Tensor inputs = world.rank == 0 ? x : at::Tensor();
  const at::Tensor targets = world.rank == P - 1 ? y : at::Tensor();  // stage stages - 1 runs on rank P - 1
  auto step = [&](pp::Schedule& schedule) {
    opt.zero_grad();
    schedule.step(inputs, targets);
    loop.phase(loop.optimizer, [&] { opt.step(); });
  };
  const auto timed = make_schedule(false);
  loop.run([&] {
    step(*timed);
    if (loop.timed) r.pp_bubble.push_back(timed->last_step().bubble());
  });
  const auto counted = make_schedule(!o.cuda());
  r.pp_activation_bytes = 0;
  for (int i = 0; i < 2; ++i) {
    const int64_t start = o.cuda() ? cuda_reset_peak(world.local_rank) : 0;
    step(*counted);
    const int64_t held = o.cuda() ? cuda_peak_bytes(world.local_rank) - start : counted->last_step().peak_bytes.value_or(0);
    r.pp_activation_bytes = std::max(r.pp_activation_bytes, held);
  }
}

template <typename Holder>
Result measure(const Options& o, const comm::World& world, const std::shared_ptr<comm::ProcessGroup>& pg,
               const std::function<Holder()>& make) {
  Result r;
  torch::manual_seed(0);
  Holder net = make();
  for (const auto& p : net->parameters()) {
    r.params += p.numel();
    if (p.requires_grad()) r.grad_bytes += p.numel() * static_cast<int64_t>(at::elementSize(at::kFloat));
  }
  const c10::Device device =
      o.cuda() ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(o.dp() ? 0 : world.local_rank)) : c10::kCPU;
  // DataParallel: B per replica. Tensor parallelism and pipelines: each TP group, or the pipeline,
  // trains one batch of B per rank in it, the same on each of its ranks (Note [TP traffic]).
  const int tp = bench::tp_group_size(o.entry(), world.world_size);
  const int group = bench::batch_group_size(o.entry(), world.world_size);
  const int64_t samples = o.dp() ? o.batch * o.replicas : o.batch * group;
  auto [x_cpu, y_cpu] = bench::synthetic_batch(o.model, o.scale, samples, 100 + static_cast<uint64_t>(world.rank / group));
  const at::Tensor x = x_cpu.to(device), y = y_cpu.to(device);
  auto scaler = make_scaler(o);
  amp::GradScaler* scaler_ptr = scaler ? &*scaler : nullptr;
  Loop loop(o, pg.get());

  if (o.strategy == "single") {
    net->to(device);
    auto opt = make_sgd(net->parameters());
    loop.run([&] { plain_step(o, loop, opt, scaler_ptr, y, [&] { return net->forward(x); }); });
  } else if (o.strategy == "ddp" || o.strategy == "ddp-no-sync" || o.strategy == "zero1" || o.strategy == "zero2") {
    net->to(device);
    ddp::DistributedDataParallel model(net, pg);
    auto opt = make_sgd(model->parameters());
    std::optional<zero::ShardedOptimizer> sharded;  // zero1: ZeRO-1 over the same SGD
    if (o.strategy == "zero1") sharded.emplace(opt, pg);
    std::optional<zero::GradientShardedOptimizer> flat;  // zero2: ZeRO-2 over the same SGD
    if (o.strategy == "zero2") flat.emplace(opt, model->reducer(), pg);
    const bool sync = o.strategy != "ddp-no-sync";
    loop.run([&] {
      std::optional<ddp::NoSyncGuard> no_sync;
      if (!sync) no_sync.emplace(model->no_sync());
      plain_step(o, loop, Stepper(opt, sharded ? &*sharded : nullptr, flat ? &*flat : nullptr), scaler_ptr, y,
                 [&] { return model->forward(x); });
    });
    r.bucket_bytes = bucket_layout(*model);
    r.buckets = static_cast<int64_t>(r.bucket_bytes.size());
    if (sync) r.model_state = model_state_bytes(*net, opt);
    // ZeRO-2 keeps only this rank's gradient slices between steps (the buckets live while reduced).
    if (flat) (*r.model_state)[1] = flat->shard_numel() * static_cast<int64_t>(at::elementSize(at::kFloat));
  } else if (o.strategy == "fsdp") {
    net->to(device);
    fsdp::FullyShardedDataParallel model(net, pg, fsdp_options(o));
    auto opt = make_sgd(model->shard_parameters());
    loop.run([&] {
      const fsdp::CommWaits before = model->comm_waits();
      plain_step(o, loop, Stepper(opt, nullptr, nullptr), scaler_ptr, y, [&] { return model->forward(x); });
      const fsdp::CommWaits after = model->comm_waits();
      if (!loop.timed) return;
      r.exposed_gather.push_back(after.all_gather_s - before.all_gather_s);
      r.exposed_reduce_scatter.push_back(after.reduce_scatter_s - before.reduce_scatter_s);
    });
    // Between steps: the shards, their gradients, the optimizer's state of the shards.
    model->engine().reset_peak();
    Loop untimed(o);
    plain_step(o, untimed, Stepper(opt, nullptr, nullptr), scaler_ptr, y, [&] { return model->forward(x); });
    const auto m = model->memory();
    r.model_state = std::array<int64_t, 3>{m.parameter_shards, m.gradient_shards, zero::optimizer_state_bytes(opt)};
    r.transient = std::array<int64_t, 2>{m.peak_transient, m.two_largest_units};
  } else if (!o.entry().pp_schedule.empty()) {
    if constexpr (std::is_same_v<Holder, bench::Gpt>) {
      net->to(device);
      measure_pipeline(o, world, pg, net, x, y, loop, r);
    }
  } else if (o.entry().tp_size != 0) {
    // Note [TP traffic]
    // tp: one TP group of every rank; fsdp+tp: TP pairs, FSDP across them (mesh dp x tp). The
    // layers are cut by gpt_tp_plan, the loss is the vocab-parallel cross entropy. The TP group's
    // collectives (tensor parallelism's own: activations, their gradients, the loss's sums) are
    // counted per timed step from its ProcessGroup::traffic(): how many, the bytes of their
    // buffers, and the host time blocked in them, which on CPU backends is their whole time (a
    // layer waits for its all-reduce before it goes on: nothing hides it). FSDP's, on the dp
    // group, are timed as for fsdp.
    net->to(device);
    comm::DeviceMesh mesh(pg, {world.world_size / tp, tp}, {"dp", "tp"});
    tp::parallelize(*net, mesh["tp"], bench::gpt_tp_plan());
    const auto tp_group = mesh.group("tp");
    const LossFn vocab_parallel = [&tp_group](const at::Tensor& logits, const at::Tensor& target) {
      return tp::cross_entropy(logits.to(at::kFloat), target, tp_group);
    };
    auto traffic_step = [&](const std::function<void()>& step, const std::function<void()>& after = {}) {
      const auto before = tp_group->traffic();
      step();
      const auto now = tp_group->traffic();
      if (!loop.timed) return;
      r.tp_wait.push_back(now.wait_s - before.wait_s);
      r.tp_bytes.push_back(static_cast<double>(now.bytes - before.bytes));
      r.tp_collectives.push_back(static_cast<double>(now.collectives - before.collectives));
      if (after) after();
    };
    if (mesh.size("dp") == 1) {
      auto opt = make_sgd(net->parameters());
      loop.run([&] {
        traffic_step([&] { plain_step(o, loop, opt, scaler_ptr, y, [&] { return net->forward(x); }, vocab_parallel); });
      });
      r.model_state = model_state_bytes(*net, opt);
    } else {
      fsdp::FullyShardedDataParallel model(net, mesh.group("dp"), fsdp_options(o));
      auto opt = make_sgd(model->shard_parameters());
      loop.run([&] {
        const fsdp::CommWaits before = model->comm_waits();
        traffic_step(
            [&] {
              plain_step(o, loop, Stepper(opt, nullptr, nullptr), scaler_ptr, y, [&] { return model->forward(x); },
                         vocab_parallel);
            },
            [&] {
              const fsdp::CommWaits after = model->comm_waits();
              r.exposed_gather.push_back(after.all_gather_s - before.all_gather_s);
              r.exposed_reduce_scatter.push_back(after.reduce_scatter_s - before.reduce_scatter_s);
            });
      });
      const auto m = model->memory();
      r.model_state = std::array<int64_t, 3>{m.parameter_shards, m.gradient_shards, zero::optimizer_state_bytes(opt)};
    }
  } else if (o.strategy == "accelerate" || o.strategy == "accelerate-zero1" || o.strategy == "accelerate-zero2") {
    const Precision precision =
        o.precision == "bf16" ? Precision::Bf16 : (o.precision == "fp16" ? Precision::Fp16 : Precision::No);
    const int zero_stage = o.strategy == "accelerate" ? 0 : o.strategy.back() - '0';
    Accelerator acc(pg, AcceleratorOptions()
                            .strategy(Strategy::Ddp)
                            .mixed_precision(precision)
                            .zero_stage(zero_stage)
                            .progress(false));
    auto model = acc.prepare_model(net);
    auto opt = make_sgd(model->parameters());
    acc.prepare_optimizer(opt);
    const at::Tensor xa = x.to(acc.device()), ya = y.to(acc.device());
    loop.run([&] {
      auto sync = acc.accumulate(model);
      at::Tensor loss;
      loop.phase(loop.forward, [&] { loss = bench::loss_of(model->forward(xa), ya); });  // autocast inside
      loop.phase(loop.backward, [&] { acc.backward(loss); });
      loop.phase(loop.optimizer, [&] {
        acc.step(opt);
        acc.zero_grad(opt);
      });
    });
    auto children = model->named_children();
    if (const auto* wrapper = children.find("wrapper")) {
      if (auto ddp = std::dynamic_pointer_cast<ddp::DistributedDataParallelImpl<Holder>>(*wrapper)) {
        r.bucket_bytes = bucket_layout(*ddp);
        r.buckets = static_cast<int64_t>(r.bucket_bytes.size());
      }
    }
  } else if (o.dp()) {
    std::vector<c10::Device> devices;
    for (int k = 0; k < o.replicas; ++k) {
      devices.push_back(o.cuda() ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(k)) : c10::Device(c10::kCPU));
    }
    const auto mode = o.strategy == "dp-replicate" ? dp::Mode::Replicate : dp::Mode::Persistent;
    auto options = dp::DataParallelOptions().devices(devices).mode(mode);
    std::optional<torch::optim::SGD> opt;
    {
      // Timed without the allocation tracker: tracking never slows the timed steps.
      dp::DataParallel model(net, dp::DataParallelOptions(options).track_cpu_memory(false), make);
      opt.emplace(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
      loop.run([&] { plain_step(o, loop, *opt, scaler_ptr, y, [&] { return model->forward(x); }); });
    }
    if (o.cuda()) {
      for (int k = 0; k < o.replicas; ++k) r.device_bytes.push_back(cuda_peak_bytes(k));
    } else {
      // A short separate phase, untimed, with the tracker on: each replica's memory.
      dp::DataParallel model(net, dp::DataParallelOptions(options).track_cpu_memory(true), make);
      model->reset_memory_peaks();
      Loop untimed(o);
      for (int i = 0; i < 2; ++i) plain_step(o, untimed, *opt, scaler_ptr, y, [&] { return model->forward(x); });
      auto report = model->memory_report();
      report.add_optimizer(*opt);
      for (const auto& replica : report.replicas) r.replica_bytes.push_back(replica.total());
    }
  } else if (o.strategy == "allreduce") {
    // DDP's bucket layout, learnt from two synced steps (the buckets are rebuilt after the
    // first), untimed; then the same bytes all-reduced without any model.
    net->to(device);
    std::vector<int64_t> bucket_bytes;
    {
      ddp::DistributedDataParallel model(net, pg);
      auto opt = make_sgd(model->parameters());
      Options probe = o;
      probe.warmup = 2;
      probe.steps = 0;
      Loop untimed(probe);
      untimed.run([&] { plain_step(probe, untimed, opt, nullptr, y, [&] { return model->forward(x); }); });
      bucket_bytes = bucket_layout(*model);
    }
    r.buckets = static_cast<int64_t>(bucket_bytes.size());
    r.bucket_bytes = bucket_bytes;
    // The same bytes all-reduced flat (one buffer) and in DDP's buckets; the record's step times,
    // steps and faults are the buckets'.
    auto time_allreduce = [&](const std::vector<int64_t>& layout, Loop& l) {
      std::vector<at::Tensor> tensors;
      for (int64_t bytes : layout) tensors.push_back(at::ones({bytes / 4}, at::TensorOptions().device(device)));
      l.run([&] {
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
        for (auto& t : tensors) works.push_back(pg->all_reduce_async(t));
        for (auto& w : works) pg->wait(w, "benchmark all_reduce");
      });
    };
    Loop flat(o, pg.get()), bucketed(o, pg.get());
    time_allreduce({r.grad_bytes}, flat);
    time_allreduce(bucket_bytes, bucketed);
    r.take(bucketed);
    r.allreduce_p50 = percentile(r.times, 0.5);
    r.flat_allreduce_p50 = percentile(flat.times, 0.5);
  }
  if (o.strategy != "allreduce") r.take(loop);
  return r;
}

/// all_reduce of float32 buffers of --sweep-min-bytes, 4x that, ... up to --sweep-max-bytes (both
/// included when a power of 4 apart: 64 KiB .. 64 MiB is 6 sizes); no model. The record's step
/// times are those of the largest size.
Result sweep(const Options& o, const std::shared_ptr<comm::ProcessGroup>& pg, const comm::World& world) {
  Result r;
  r.sweep = Json::array();
  const c10::Device device = o.cuda() ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank))
                                      : c10::Device(c10::kCPU);
  const int64_t W = pg->size();
  for (int64_t bytes = o.sweep_min_bytes; bytes <= o.sweep_max_bytes; bytes *= 4) {
    // `bytes` is the whole buffer: reduce-scattered into (or all-gathered from) W slices of it.
    const int64_t n = (bytes / 4 + W - 1) / W * W;
    at::Tensor t = at::ones({n}, at::TensorOptions().device(device)), slice = at::ones({n / W}, t.options());
    Loop loop(o);
    loop.run([&] {
      if (o.sweep_collective == "reduce_scatter") {
        pg->wait(pg->reduce_scatter_async(slice, t), "benchmark sweep reduce_scatter");
      } else if (o.sweep_collective == "all_gather") {
        pg->wait(pg->all_gather_into_async(t, slice), "benchmark sweep all_gather");
      } else {
        pg->wait(pg->all_reduce_async(t), "benchmark sweep all_reduce");
      }
    });
    r.sweep->push_back(Json{{"bytes", bytes}, {"p50_s", percentile(loop.times, 0.5)}});
    r.take(loop);
  }
  return r;
}

// ---- the record --------------------------------------------------------------------------------

/// Devices used: the replicas for dp-* (and the peer's dp), else the ranks.
int record_world(const Options& o, const comm::World& world) { return o.dp() ? o.replicas : world.world_size; }

Json record_head(const Options& o, const comm::World& world) {
  return Json{{"record", kRecord},       {"impl", "tandem"},          {"model", o.model},
              {"scale", o.scale},        {"strategy", o.strategy},    {"device", o.device},
              {"precision", o.precision}, {"world", record_world(o, world)},
              // Several nodes: the projection validates inter-node predictions with these runs.
              {"nodes", std::max(1, world.world_size / std::max(1, world.local_world_size))}};
}

void emit(const Options& o, const Json& record) {
  const std::string line = record.dump() + "\n";
  if (o.out.empty()) {
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
  } else {
    std::ofstream file(o.out, std::ios::app);
    file << line;
    if (!file.flush()) throw Error("cannot append to " + o.out);
  }
}

/// Why this combination cannot run here, or nothing. Decided alike on every rank, before any
/// collective, so every rank exits 0 together.
std::optional<std::string> unsupported(const Options& o, const comm::World& world) {
  const bench::Strategy& entry = o.entry();
  if (!entry.tandem) return o.strategy + " is " + entry.summary + ": the PyTorch peer measures it, not Tandem's worker";
  if (entry.launch != bench::Launch::Ranks && world.world_size > 1) {
    return o.strategy + " runs in one process, but " + std::to_string(world.world_size) + " were launched";
  }
  if (std::find(entry.precisions.begin(), entry.precisions.end(), o.precision) == entry.precisions.end()) {
    return o.strategy + " does not support --precision " + o.precision;
  }
  if (auto refusal = bench::table_refusal(entry, o.model, world.world_size); !refusal.empty()) return refusal;
  if (const int tp = bench::tp_group_size(entry, world.world_size); tp > 1) {
    const auto c = bench::gpt_config(o.scale);
    if (c.heads % tp != 0 || c.vocab % tp != 0) {
      return o.strategy + " cuts the GPT's " + std::to_string(c.heads) + " heads and " + std::to_string(c.vocab) +
             " classes over " + std::to_string(tp) + " ranks: they do not divide";
    }
  }
  if (const int v = bench::pipeline_stages_per_rank(entry); v > 0) {  // Note [Pipeline measurements]
    const int P = world.world_size, m = o.microbatches_at(P);
    if (auto why = bench::gpt_pipeline_refusal(o.scale, int64_t{P} * v); !why.empty()) return o.strategy + ": " + why;
    if (m < P || (v > 1 && m % P != 0) || o.batch * P < m) {
      return o.strategy + " at " + std::to_string(P) + " ranks cannot run " + std::to_string(m) +
             " microbatches: it needs at least " + std::to_string(P) + (v > 1 ? ", a multiple of them," : "") +
             " and at most the batch's " + std::to_string(o.batch * P) + " samples";
    }
  }
  if (o.cuda()) {
    if (!built_with_cuda()) return std::string("this tandem-bench-worker was built without CUDA");
    const int gpus = comm::cuda_device_count();
    if (gpus == 0) return std::string("no CUDA device is visible");
    if (o.dp() && o.replicas > gpus) {
      return std::to_string(o.replicas) + " replicas need " + std::to_string(o.replicas) + " GPUs, but " +
             std::to_string(gpus) + " are visible";
    }
    if (!o.dp() && world.local_rank >= gpus) {
      return "LOCAL_RANK " + std::to_string(world.local_rank) + " needs GPU " + std::to_string(world.local_rank) +
             ", but " + std::to_string(gpus) + " are visible";
    }
  }
  if (auto dtype = autocast_dtype(o)) {
    try {
      amp::AutocastScope probe(device_type(o), *dtype);
    } catch (const std::exception& e) {
      return "autocast to " + o.precision + " on " + o.device + ": " + one_line(e);
    }
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"tandem-bench-worker: one measurement of Tandem (started by `tandem bench` through `tandem run`)"};
  app.add_option("--model", o.model)->check(CLI::IsMember({"small", "medium", "large"}));
  app.add_option("--scale", o.scale)->check(CLI::IsMember({"tiny", "cpu", "full"}));
  app.add_option("--strategy", o.strategy)->check(CLI::IsMember(bench::strategy_names({})));
  bool list = false;
  app.add_flag("--list-strategies", list, "print the strategy table (src/bench/strategies.h), one JSON line each");
  app.add_option("--batch-size", o.batch, "samples per device")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--steps", o.steps, "timed steps")->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::Range(0, 1 << 30));
  app.add_option("--min-seconds", o.min_seconds, "timed steps last at least this long (more than --steps)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--threads", o.threads, "intra-op threads of this process")->check(CLI::Range(1, 4096));
  app.add_option("--precision", o.precision)->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--device", o.device)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--replicas", o.replicas, "dp-*: replicas (devices)")->check(CLI::Range(1, 4096));
  app.add_option("--sweep-min-bytes", o.sweep_min_bytes, "sweep: smallest buffer")->check(CLI::Range(int64_t{4}, int64_t{1} << 40));
  app.add_option("--sweep-collective", o.sweep_collective, "sweep: which collective (the report knows all_reduce)")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather"}));
  app.add_option("--sweep-max-bytes", o.sweep_max_bytes, "sweep: largest buffer")->check(CLI::Range(int64_t{4096}, int64_t{1} << 40));
  app.add_option("--microbatches", o.microbatches, "pp-*: microbatches per step (default: twice the ranks)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--out", o.out, "append the record here (default: stdout)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "tandem-bench-worker: %s\n", e.what());
    return 2;
  }
  if (list) {
    for (const auto& s : bench::strategies()) std::printf("%s\n", bench::to_json(s).dump().c_str());
    return 0;
  }
  if (o.sweep_min_bytes % 4 != 0 || o.sweep_min_bytes > o.sweep_max_bytes) {
    std::fprintf(stderr, "tandem-bench-worker: --sweep-min-bytes %lld must be a multiple of 4, at most --sweep-max-bytes %lld\n",
                 static_cast<long long>(o.sweep_min_bytes), static_cast<long long>(o.sweep_max_bytes));
    return 2;
  }
  try {
    // A CPU measurement sees no GPU (accelerate's cpu=True): the Accelerator then picks the CPU.
    if (!o.cuda()) setenv("CUDA_VISIBLE_DEVICES", "", 1);
    const comm::World world = comm::World::from_env();
    if (auto reason = unsupported(o, world)) {
      if (world.is_main()) {
        Json record = record_head(o, world);
        record["unsupported"] = *reason;
        emit(o, record);
      }
      return 0;
    }
    at::set_num_threads(o.threads);
    // Every strategy in the same allocator state, `single` (no Tandem wrapper) included; FSDP in the
    // one it sets itself (Note [Host allocator]).
    const HostAllocatorSetting& allocator = tune_host_allocator(
        o.strategy == "fsdp" || o.strategy == "fsdp+tp" ? HostAllocatorPolicy::ReturnLarge : HostAllocatorPolicy::KeepFreed);
    if (o.cuda()) comm::bind_cuda_device(world.local_rank);
    auto pg = comm::ProcessGroup::create(world, comm::ProcessGroupOptions().use_nccl(o.cuda()));

    Result r;
    if (o.strategy == "sweep") {
      r = sweep(o, pg, world);
    } else if (o.model == "small") {
      const auto dims = bench::mlp_dims(o.scale);
      r = measure<bench::Mlp>(o, world, pg, [dims] { return bench::Mlp(dims); });
    } else if (o.model == "medium") {
      const auto config = bench::resnet_config(o.scale);
      r = measure<bench::ResNet>(o, world, pg, [config] { return bench::ResNet(config); });
    } else {
      const auto config = bench::gpt_config(o.scale);
      r = measure<bench::Gpt>(o, world, pg, [config] { return bench::Gpt(config); });
    }

    // Every rank's p50 and memory reach rank 0.
    const double p50 = percentile(r.times, 0.5);
    const double memory = o.cuda() ? static_cast<double>(cuda_peak_bytes(world.local_rank))
                                   : static_cast<double>(peak_rss_bytes());
    const auto state = r.model_state.value_or(std::array<int64_t, 3>{-1, -1, -1});
    const auto transient = r.transient.value_or(std::array<int64_t, 2>{-1, -1});
    auto all = pg->all_gather(at::tensor({p50, memory, r.faults_per_step, static_cast<double>(state[0]),
                                          static_cast<double>(state[1]), static_cast<double>(state[2]),
                                          static_cast<double>(transient[0]), static_cast<double>(transient[1]),
                                         percentile(r.pp_bubble, 0.5), static_cast<double>(r.pp_activation_bytes)},
                                         at::kDouble));
    if (world.is_main()) {
      Json rank_p50 = Json::array(), peak = Json::array(), faults = Json::array(), model_state = Json::array(),
           step_transient = Json::array();
      for (const auto& t : all) {
        rank_p50.push_back(t[0].item<double>());
        peak.push_back(static_cast<int64_t>(t[1].item<double>()));
        faults.push_back(std::round(t[2].item<double>()));
        model_state.push_back(Json{{"params", static_cast<int64_t>(t[3].item<double>())},
                                   {"grads", static_cast<int64_t>(t[4].item<double>())},
                                   {"optimizer", static_cast<int64_t>(t[5].item<double>())}});
        step_transient.push_back(Json{{"peak", static_cast<int64_t>(t[6].item<double>())},
                                      {"two_largest_units", static_cast<int64_t>(t[7].item<double>())}});
      }
      std::string mem_kind = o.cuda() ? "cuda" : "rss";
      if (o.entry().memory == bench::Memory::ReplicaAccounting) {  // DataParallel: each replica's bytes
        peak = Json::array();
        for (int64_t bytes : o.cuda() ? r.device_bytes : r.replica_bytes) peak.push_back(bytes);
        if (!o.cuda()) mem_kind = "replica";
      }
      Json record = record_head(o, world);
      // The engine of the CPU collectives, as the process group resolved it (the one-process
      // strategies communicate with nobody: no backend to name).
      if (!o.cuda() && o.entry().launch == bench::Launch::Ranks) record["backend"] = comm::to_string(pg->cpu_backend());
      record["batch_per_device"] = o.batch;
      record["steps"] = r.steps;  // what ran: --min-seconds may have run more than --steps
      record["warmup"] = o.warmup;
      record["threads"] = o.threads;
      record["params"] = r.params;
      record["grad_bytes"] = r.grad_bytes;
      record["buckets"] = r.buckets;
      record["bucket_bytes"] = r.bucket_bytes;
      record["p50_s"] = p50;
      record["p95_s"] = percentile(r.times, 0.95);
      record["rank_p50_s"] = rank_p50;
      record["forward_p50_s"] = percentile(r.forward, 0.5);
      record["backward_p50_s"] = percentile(r.backward, 0.5);
      record["optimizer_p50_s"] = percentile(r.optimizer, 0.5);
      if (!r.exposed_gather.empty()) {  // rank 0's, as the phases
        record["exposed_gather_p50_s"] = percentile(r.exposed_gather, 0.5);
        record["exposed_reduce_scatter_p50_s"] = percentile(r.exposed_reduce_scatter, 0.5);
      }
      if (const int v = bench::pipeline_stages_per_rank(o.entry()); v > 0) {  // Note [Pipeline measurements]
        const int P = world.world_size, m = o.microbatches_at(P);
        Json bubble = Json::array(), held = Json::array();
        for (const auto& t : all) {
          bubble.push_back(t[8].item<double>());
          held.push_back(static_cast<int64_t>(t[9].item<double>()));
        }
        record["pp_schedule"] = o.entry().pp_schedule;
        record["pp_microbatches"] = m;
        record["pp_stages_per_rank"] = v;
        record["rank_pp_bubble"] = bubble;
        record["pp_bubble_theory"] = static_cast<double>(P - 1) / (v * m + P - 1);
        record["rank_pp_activation_bytes"] = held;
      }
      if (o.entry().tp_size != 0) {  // rank 0's TP group, per timed step (Note [TP traffic])
        record["tp_size"] = bench::tp_group_size(o.entry(), world.world_size);
        record["tp_comm_p50_s"] = percentile(r.tp_wait, 0.5);
        record["tp_comm_bytes"] = static_cast<int64_t>(percentile(r.tp_bytes, 0.5));
        record["tp_collectives"] = static_cast<int64_t>(percentile(r.tp_collectives, 0.5));
      }
      record["peak_mem_bytes"] = peak;
      record["mem_kind"] = mem_kind;
      record["rank_faults_per_step"] = faults;
      record["host_allocator"] = allocator.mode;
      if (r.model_state) record["model_state_bytes"] = model_state;  // per rank, accounted
      if (r.transient) record["step_transient_bytes"] = step_transient;
      if (r.allreduce_p50) record["allreduce_p50_s"] = *r.allreduce_p50;
      if (r.flat_allreduce_p50) record["flat_allreduce_p50_s"] = *r.flat_allreduce_p50;
      if (r.sweep) record["sweep"] = *r.sweep;
      if (r.sweep && o.sweep_collective != "all_reduce") record["sweep_collective"] = o.sweep_collective;
      record["versions"] = Json{{"torch", built_with_torch_version()}, {"tandem", version()}};
      emit(o, record);
    }
    pg->barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-bench-worker: %s\n", one_line(e).c_str());
    return 1;
  }
  return 0;
}
