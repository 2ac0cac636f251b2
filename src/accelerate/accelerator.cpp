#include "tandem/accelerate/accelerator.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <optional>

#include <c10/util/accumulate.h>
#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include "tandem/comm/cuda_info.h"
#include "tandem/error.h"
#include "tandem/fsdp/fsdp_optimizer.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/host_allocator.h"
#include "tandem/tp/parallelize.h"
#include "tandem/zero/clip_grad_norm.h"
#include "tandem/zero/gradient_sharded_optimizer.h"
#include "tandem/zero/sharded_optimizer.h"

namespace tandem {

const char* to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::Auto: return "auto";
    case Strategy::Single: return "single";
    case Strategy::DataParallel: return "dp";
    case Strategy::Ddp: return "ddp";
    case Strategy::Fsdp: return "fsdp";
  }
  return "?";
}

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::No: return "no";
    case Precision::Fp16: return "fp16";
    case Precision::Bf16: return "bf16";
  }
  return "?";
}

// ---- construction -------------------------------------------------------------------------------

Accelerator::Accelerator(AcceleratorOptions options) : options_(std::move(options)), world_(comm::World::from_env()) {
  initialize();
}

Accelerator::Accelerator(std::shared_ptr<comm::ProcessGroup> process_group, AcceleratorOptions options)
    : options_(std::move(options)), pg_(std::move(process_group)) {
  TANDEM_CHECK(pg_, "Accelerator: the process group is null");
  world_ = pg_->world();
  initialize();
}

void Accelerator::initialize() {
  TANDEM_CHECK(options_.gradient_accumulation_steps() >= 1, "Accelerator: gradient_accumulation_steps must be >= 1 (got ",
               options_.gradient_accumulation_steps(), ")");
  TANDEM_CHECK(options_.collective_timeout().count() > 0, "Accelerator: collective_timeout must be positive");
  TANDEM_CHECK(options_.zero_stage() >= 0 && options_.zero_stage() <= 2, "Accelerator: zero_stage ",
               options_.zero_stage(), " is not available (0: plain DDP, 1: optimizer state sharded, 2: gradients "
               "sharded too; parameters sharded too is Strategy::Fsdp)");
  // Before any CUDA work: this rank's GPU becomes the current device (one per rank on a node).
  comm::bind_cuda_device(world_.local_rank);
  choose_strategy();
  // Note [Host allocator]: every strategy, a single process included; FSDP gives memory back.
  tune_host_allocator(plan_.strategy == Strategy::Fsdp ? HostAllocatorPolicy::ReturnLarge : HostAllocatorPolicy::KeepFreed);
  if (!pg_ && (world_.world_size > 1 || plan_.strategy == Strategy::Ddp || plan_.strategy == Strategy::Fsdp)) {
    pg_ = comm::ProcessGroup::create(world_, comm::ProcessGroupOptions().timeout(options_.collective_timeout()));
  }
  if (plan_.pp > 1) {  // Note [Parallelism plan]: pipeline stages slowest (tp_size is 1 with them)
    mesh_.emplace(pg_, std::vector<int64_t>{plan_.pp, plan_.replicate, plan_.shard},
                  std::vector<std::string>{"pp", "replicate", "shard"});
    dp_group_ = mesh_->flatten({"replicate", "shard"}, "dp").group();
  } else if (plan_.tp > 1) {
    mesh_.emplace(pg_, std::vector<int64_t>{plan_.replicate, plan_.shard, plan_.tp},
                  std::vector<std::string>{"replicate", "shard", "tp"});
    dp_group_ = mesh_->flatten({"replicate", "shard"}, "dp").group();
  } else if (plan_.hybrid()) {
    mesh_.emplace(pg_, std::vector<int64_t>{plan_.replicate, plan_.shard}, std::vector<std::string>{"replicate", "shard"});
  }
  // One seed per data-parallel rank: a tensor-parallel group draws the same dropout masks on the
  // activations it holds whole, as one process would, and its own per rank inside a
  // nn::RegionRng (Megatron's seeding: tandem/tp/random.h). Per stage from prepare_pipeline on.
  tp::manual_seed(options_.seed(), {data_parallel_rank(), parallel_ranks().tp, 0});
  if (options_.mixed_precision() == Precision::Fp16) {
    scaler_ = pg_ ? std::make_unique<amp::GradScaler>(pg_, options_.scaler())
                  : std::make_unique<amp::GradScaler>(options_.scaler());
  }
  print("tandem: strategy %s (%s), device %s, mixed precision %s, %d process%s%s\n", to_string(plan_.strategy),
        reason_.c_str(), device_.str().c_str(), to_string(options_.mixed_precision()), world_.world_size,
        world_.world_size == 1 ? "" : "es",
        plan_.hybrid() || plan_.tp > 1 || plan_.pp > 1 ? (" as " + plan_.describe()).c_str() : "");
}

std::shared_ptr<comm::ProcessGroup> Accelerator::pipeline_group() {
  if (plan_.pp > 1) return mesh_->group("pp");
  if (!pipeline_group_) {
    pipeline_group_ = pg_ ? pg_->split(world_.rank, "pp") : comm::ProcessGroup::create(world_);
  }
  return pipeline_group_;
}

std::vector<int> Accelerator::pipeline_stages(int stages) const {
  TANDEM_CHECK(stages >= plan_.pp && stages % plan_.pp == 0, "pipeline_stages: ", stages,
               " stages over pp_size ", plan_.pp, ": each process holds the same number of stages");
  std::vector<int> mine;
  for (int s = pipeline_rank(); s < stages; s += plan_.pp) mine.push_back(s);
  return mine;
}

// Note [Seeds per stage]
// Megatron seeds each pipeline stage apart (seed + 100 x stage), so that stages do not draw the
// same dropout masks. Here that happens when the pipeline is prepared, not at construction: the
// model is built after the Accelerator, whole on every stage (each keeps its own layers), and its
// initial weights must be the same on every stage to be the model a run without a pipeline
// trains. What is drawn from then on (dropout) is each stage's own.
void Accelerator::seed_stage() { tp::manual_seed(options_.seed(), parallel_ranks()); }

void Accelerator::check_pipeline(size_t stages, const PipelineOptions& options) const {
  TANDEM_CHECK(stages >= 1, "prepare_pipeline: no stage given (this process's parts of the model)");
  TANDEM_CHECK(stages == 1 || options.schedule() == PipelineSchedule::Interleaved1F1B, "prepare_pipeline: ", stages,
               " stages on this process: only PipelineSchedule::Interleaved1F1B runs several per process");
  // The schedules' own refusals of m, here before any stage is prepared (same on every process).
  const int m = options.microbatches() > 0 ? options.microbatches() : 2 * plan_.pp;
  TANDEM_CHECK(options.microbatches() >= 0, "prepare_pipeline: microbatches ", options.microbatches(),
               " (0: twice pp_size)");
  TANDEM_CHECK(m >= plan_.pp, "prepare_pipeline: ", m, " microbatches over pp_size ", plan_.pp,
               ": a pipeline needs at least as many microbatches as processes to fill");
  TANDEM_CHECK(options.schedule() != PipelineSchedule::Interleaved1F1B || m % plan_.pp == 0, "prepare_pipeline: ",
               "interleaved 1F1B with ", m, " microbatches over pp_size ", plan_.pp,
               ": the microbatches must be a multiple of the processes");
  check_pipeline_options("prepare_pipeline");
}

// What a pipeline cannot compose with, from the options alone: refused at construction under
// pp_size > 1 (before anything is prepared), and by prepare_pipeline at pp_size 1.
void Accelerator::check_pipeline_options(const std::string& who) const {
  TANDEM_CHECK(options_.mixed_precision() != Precision::Fp16, who, ": fp16 under a pipeline is not built "
               "yet (its loss scale would have to reach every stage's backward); use Precision::Bf16");
  TANDEM_CHECK(options_.gradient_accumulation_steps() == 1, who, ": gradient_accumulation_steps ",
               options_.gradient_accumulation_steps(), ": a pipeline step accumulates its microbatches already; raise "
               "PipelineOptions::microbatches instead");
  TANDEM_CHECK(options_.zero_stage() == 0, who, ": zero_stage ", options_.zero_stage(),
               " over pipeline stages is not built yet; use Strategy::Fsdp (it shards each stage) or zero_stage 0");
  TANDEM_CHECK(plan_.strategy != Strategy::DataParallel, who, ": DataParallel runs in one process; a "
               "pipeline's stages run one process each (Strategy::Ddp, Fsdp or Auto)");
}

Accelerator::~Accelerator() = default;

void Accelerator::choose_strategy() {
  const int gpus = comm::cuda_device_count();
  const int processes = world_.world_size;
  const std::string launched = std::to_string(processes) + " process" + (processes == 1 ? "" : "es") +
                               (processes > 1 ? std::string(" launched by ") + comm::to_string(world_.source) : "");
  const std::string gpu_text = gpus == 0 ? "no GPU" : std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s");
  plan_ = plan_parallelism(options_.parallelism(), options_.strategy(), processes);
  if (options_.strategy() == Strategy::Auto && plan_.strategy == Strategy::Fsdp) {
    reason_ = "auto: shard_size " + std::to_string(options_.parallelism().shard_size()) + "; " + launched;
  } else if (plan_.strategy == Strategy::Auto) {
    if (processes > 1) {
      plan_.strategy = Strategy::Ddp;
      reason_ = "auto: " + launched;
    } else if (gpus > 1) {
      plan_.strategy = Strategy::DataParallel;
      reason_ = "auto: 1 process and " + gpu_text;
    } else {
      plan_.strategy = Strategy::Single;
      reason_ = "auto: 1 process and " + gpu_text;
    }
  } else {
    reason_ = "asked; " + launched + ", " + gpu_text;
  }
  TANDEM_CHECK(processes == 1 || plan_.strategy == Strategy::Ddp || plan_.strategy == Strategy::Fsdp,
               "Accelerator: strategy ", to_string(plan_.strategy), " runs in one process, but ", launched,
               ": use Strategy::Ddp (or Auto), or start one process");
  TANDEM_CHECK(options_.zero_stage() == 0 || plan_.strategy != Strategy::Fsdp, "Accelerator: zero_stage ",
               options_.zero_stage(), " with Strategy::Fsdp: FSDP shards parameters, gradients and optimizer state "
               "already (ZeRO-3); leave zero_stage at 0");
  TANDEM_CHECK(options_.zero_stage() == 0 || plan_.tp == 1, "Accelerator: zero_stage ", options_.zero_stage(),
               " with tp_size ", plan_.tp, ": ZeRO over tensor-parallel pieces is not built; use Strategy::Fsdp (it "
               "shards the pieces) or zero_stage 0");
  TANDEM_CHECK(options_.zero_stage() == 0 || plan_.strategy != Strategy::DataParallel, "Accelerator: zero_stage ",
               options_.zero_stage(), " shards the optimizer across processes, and DataParallel runs in one: start "
               "one process per device (tandem run --nproc-per-node N) with Strategy::Ddp, or use zero_stage 0");
  if (plan_.pp > 1) check_pipeline_options("Accelerator: pp_size " + std::to_string(plan_.pp));
  device_ = gpus > 0 ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(
                                                   plan_.strategy == Strategy::DataParallel ? 0 : world_.local_rank))
                     : c10::Device(c10::kCPU);
}

fsdp::FullyShardOptions Accelerator::fsdp_options(torch::nn::Module& model) const {
  fsdp::FullyShardOptions options = options_.fsdp();
  if (mesh_ && plan_.replicate > 1) options.replicate_group(mesh_->group("replicate"));  // HSDP
  if (!options.auto_wrap() && !fsdp::has_units(model)) options.auto_wrap(fsdp::AutoWrapPolicy());
  if (!options.activation_checkpointing()) options.activation_checkpointing(options_.activation_checkpointing());
  // accelerate's FSDP2 plugin: mixed_precision gathers, computes and reduces in its dtype (autocast
  // still applies on top); a param_dtype of the user's own wins, float32 gathers whole precision.
  fsdp::MixedPrecisionPolicy policy = options.mixed_precision();
  if (!policy.param_dtype() && options_.mixed_precision() != Precision::No) {
    const at::ScalarType dtype = options_.mixed_precision() == Precision::Bf16 ? at::kBFloat16 : at::kHalf;
    policy.param_dtype(dtype).reduce_dtype(policy.reduce_dtype().value_or(dtype));
    options.mixed_precision(policy);
  }
  return options;
}

void Accelerator::checkpoint_activations(torch::nn::Module& model) const {
  TANDEM_CHECK(plan_.strategy != Strategy::DataParallel,
               "Accelerator: activation_checkpointing is not available under DataParallel (its replicas are clones "
               "of the model): start one process per device (tandem run --nproc-per-node N) with Strategy::Ddp or Fsdp");
  nn::checkpoint_modules(model, *options_.activation_checkpointing());
}

// Note [Layouts]
// Every tensor of a prepared model lies on the mesh ("replicate", "shard", "tp") of its pipeline
// stage (a stage's tensors live on its processes only, so "pp" is not among a layout's
// dimensions) as DTensor would place it: Replicate along "replicate"; along "shard", FSDP's rows
// (Shard(0); a _StridedShard when tensor parallelism cut dim 0 first, since FSDP shards the
// rows of the piece it was given) or Replicate; along "tp", the plan's Shard(d) or Replicate.
// Strategies are compositions of placements: DDP (R, R, R), FSDP (R, S(0), R), HSDP with
// replicas, TP (R, R, S(d)), FSDP + TP (R, S(0), S(d)). The box follows from the placements
// (comm::local_chunk, the one split rule); FSDP's own rows are checked against it. Which copy
// counts (checkpoints write it, clip_grad_norm sums it) is Layout::counts: the first along every
// Replicate dimension.
comm::Layout Accelerator::layout_of(const at::Tensor& param, const std::vector<int64_t>& local_shape,
                                    const TensorParallelCut& cut, std::optional<std::pair<int64_t, int64_t>> rows) const {
  const int dp = data_parallel_rank();  // "replicate" x "shard", row-major (Note [Parallelism plan])
  std::vector<int64_t> coordinate{dp / plan_.shard, dp % plan_.shard, parallel_ranks().tp};
  std::vector<int64_t> shape = local_shape;
  comm::Placement tp = comm::Placement::replicate(), shard = comm::Placement::replicate();
  auto it = cut.dims.find(param.unsafeGetTensorImpl());
  if (it != cut.dims.end()) {  // tp::parallelize cuts evenly: rank r holds the r-th of `size` equal parts
    shape[static_cast<size_t>(it->second)] *= cut.size;
    tp = comm::Placement::shard(it->second);
  }
  if (rows) shard = tp.is_shard() && tp.dim == 0 ? comm::Placement::strided_shard(0, plan_.tp) : comm::Placement::shard(0);
  comm::Layout layout = comm::make_layout({"replicate", "shard", "tp"}, {plan_.replicate, plan_.shard, plan_.tp},
                                          std::move(coordinate), {comm::Placement::replicate(), shard, tp},
                                          std::move(shape));
  if (rows && rows->second > 0) {  // FSDP's rows are of the tensor-parallel piece: its offset first
    const int64_t piece_offset = tp.is_shard() && tp.dim == 0 ? layout.coordinate[2] * local_shape[0] : 0;
    TANDEM_CHECK(layout.chunk.sizes[0] == rows->second && layout.chunk.offsets[0] == piece_offset + rows->first,
                 "Accelerator: internal error: FSDP holds rows [", rows->first, ", ", rows->first + rows->second,
                 ") of a tensor the layout ", layout.str(), " places elsewhere");
  }
  return layout;
}

const Accelerator::TensorParallelCut& Accelerator::tp_cut_of(const at::Tensor& param) const {
  static const TensorParallelCut none;
  for (const auto& m : models_) {
    if (m.tp.dims.count(param.unsafeGetTensorImpl())) return m.tp;
  }
  return none;
}

std::vector<Accelerator::ModelSlot> Accelerator::model_layout(const fsdp::ShardedParameters* engine,
                                                              torch::nn::Module& module,
                                                              const TensorParallelCut& cut) const {
  std::vector<ModelSlot> slots;
  for (const auto& item : module.named_parameters(true)) {
    const auto spec = engine ? engine->spec_of(item.value()) : std::nullopt;
    if (spec) {
      // The shard's dtype: the gathered parameter may be lower precision (mixed precision).
      slots.push_back({item.key(), engine->shard_of(item.value()).scalar_type(),
                       layout_of(item.value(), spec->shape, cut, std::make_pair(spec->first_row, spec->owned_rows))});
    } else {
      slots.push_back({item.key(), item.value().scalar_type(),
                       layout_of(item.value(), item.value().sizes().vec(), cut, std::nullopt)});
    }
  }
  for (const auto& item : module.named_buffers(true)) {
    slots.push_back({item.key(), item.value().scalar_type(),
                     layout_of(item.value(), item.value().sizes().vec(), {}, std::nullopt)});
  }
  return slots;
}

std::vector<LaidOutTensor> Accelerator::layouts_of(const torch::nn::Module* owner) const {
  for (const auto& m : models_) {
    if (m.owner.get() != owner) continue;
    auto slots = m.layout();
    auto held = m.held();  // the same names, in the same order
    std::vector<LaidOutTensor> out;
    for (size_t i = 0; i < slots.size(); ++i) out.push_back({slots[i].name, std::move(slots[i].layout), held[i].second});
    return out;
  }
  throw Error("layouts: this model was not prepared by this Accelerator (prepare_model or prepare_pipeline)");
}

Accelerator::NamedTensors Accelerator::model_held(const fsdp::ShardedParameters* engine, torch::nn::Module& module) {
  NamedTensors held;
  for (const auto& item : module.named_parameters(true)) {
    const auto spec = engine ? engine->spec_of(item.value()) : std::nullopt;
    if (spec) {
      held.emplace_back(item.key(), engine->shard_of(item.value()).view(spec->owned_shape()));
    } else {
      held.emplace_back(item.key(), item.value());
    }
  }
  for (const auto& item : module.named_buffers(true)) held.emplace_back(item.key(), item.value());
  return held;
}

void Accelerator::load_model(fsdp::ShardedParameters* engine, torch::nn::Module& module, const NamedTensors& held) {
  at::NoGradGuard no_grad;
  if (engine) engine->load_shards(held);
  std::map<std::string, at::Tensor> own;
  if (!engine) {
    for (const auto& item : module.named_parameters(true)) own.emplace(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(true)) own.emplace(item.key(), item.value());
  for (const auto& [name, tensor] : held) {
    auto it = own.find(name);
    if (it != own.end()) it->second.copy_(tensor);
  }
}

void Accelerator::prepare_optimizer(torch::optim::Optimizer& optimizer) {
  TANDEM_CHECK(!index_of(optimizer), "prepare_optimizer: this optimizer is prepared already");
  // One process has nothing to shard: the optimizer stays whole (whatever the strategy, so that
  // its checkpoints load under Single and Ddp alike).
  const bool shard = options_.zero_stage() >= 1 && pg_ && pg_->size() > 1 && plan_.strategy == Strategy::Ddp;
  std::unique_ptr<zero::DistributedOptimizer> prepared;  // may throw: nothing kept
  if (plan_.strategy == Strategy::Fsdp) {
    // FSDP: the optimizer steps the shards of the model whose parameters it holds.
    std::shared_ptr<fsdp::ShardedParameters> engine;
    for (const auto& group : optimizer.param_groups()) {
      for (const auto& p : group.params()) {
        for (const auto& m : models_) {
          if (m.fsdp && m.fsdp->spec_of(p)) engine = m.fsdp;
        }
      }
    }
    TANDEM_CHECK(engine, "prepare_optimizer: under Strategy::Fsdp the optimizer steps the shards of a prepared "
                         "model: prepare that model (prepare_model) before its optimizer");
    prepared = std::make_unique<fsdp::FsdpOptimizer>(optimizer, engine);
  } else if (shard && options_.zero_stage() == 1) {
    prepared = std::make_unique<zero::ShardedOptimizer>(optimizer, data_parallel_group());
  } else if (shard && options_.zero_stage() == 2) {
    // ZeRO-2 shards in the reducer of the model whose parameters the optimizer holds.
    ddp::Reducer* reducer = nullptr;
    const void* first = optimizer.param_groups().empty() || optimizer.param_groups()[0].params().empty()
                            ? nullptr
                            : optimizer.param_groups()[0].params()[0].unsafeGetTensorImpl();
    for (const auto& m : models_) {
      if (!m.reducer) continue;
      for (const auto& p : m.reducer->parameters()) {
        if (p.unsafeGetTensorImpl() == first) reducer = m.reducer;
      }
    }
    TANDEM_CHECK(reducer, "prepare_optimizer: zero_stage 2 shards gradients in the DDP of the model the optimizer "
                          "trains: prepare that model (prepare_model) before its optimizer");
    prepared = std::make_unique<zero::GradientShardedOptimizer>(optimizer, *reducer, data_parallel_group());
  } else {
    prepared = std::make_unique<zero::WholeOptimizer>(optimizer);
  }
  optimizers_.push_back(std::move(prepared));
}

std::optional<size_t> Accelerator::index_of(const torch::optim::Optimizer& optimizer) const {
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    if (&optimizers_[o]->optimizer() == &optimizer) return o;
  }
  return std::nullopt;
}

zero::DistributedOptimizer* Accelerator::prepared_of(const torch::optim::Optimizer& optimizer) const {
  const auto o = index_of(optimizer);
  return o ? optimizers_[*o].get() : nullptr;
}

data::DistributedSamplerOptions Accelerator::sampler_options(bool shuffle) const {
  return data::DistributedSamplerOptions().shuffle(shuffle).seed(options_.seed()).drop_last(!options_.even_batches());
}

accelerate::PreparedLoader<accelerate::TensorPairDataset> Accelerator::prepare_data(at::Tensor data, at::Tensor targets,
                                                                                    int64_t batch_size, bool shuffle) {
  return prepare_data(accelerate::TensorPairDataset(std::move(data), std::move(targets)), batch_size, shuffle);
}

// ---- the loop -------------------------------------------------------------------------------------

AccumulateScope::~AccumulateScope() {
  if (set_sync_) set_sync_(true);
}
AccumulateScope::AccumulateScope(AccumulateScope&& other) noexcept : set_sync_(std::move(other.set_sync_)) {
  other.set_sync_ = nullptr;
}

// accelerate's GradientState: sync on every k-th batch and on the data's last batch.
void Accelerator::begin_accumulation_step() {
  const int k = options_.gradient_accumulation_steps();
  if (end_of_data_) {
    accumulation_step_ = 0;
    sync_gradients_ = true;
  } else {
    ++accumulation_step_;
    sync_gradients_ = accumulation_step_ % k == 0;
  }
}

void Accelerator::on_batch(const accelerate::LoaderProgress& progress) {
  last_batch_ = progress;
  end_of_data_ = progress.last_batch;
}

void Accelerator::backward(const at::Tensor& loss) {
  const int k = options_.gradient_accumulation_steps();
  at::Tensor scaled = k > 1 ? loss / k : loss;
  if (scaler_) scaled = scaler_->scale(scaled);
  scaled.backward();
}

bool Accelerator::step(torch::optim::Optimizer& optimizer) {
  if (!sync_gradients_) return false;
  // The scaler (fp16) or a plain step; a sharded optimizer then hands every owner's update round.
  auto stepper = [this](torch::optim::Optimizer& o) { return amp::step_optimizer(o, scaler_.get()); };
  zero::DistributedOptimizer* prepared = prepared_of(optimizer);
  const bool stepped = prepared ? prepared->step(stepper) : stepper(optimizer);
  if (scaler_) {
    // One update per iteration, once every prepared optimizer has stepped.
    bool all_stepped = true;
    for (const auto& o : optimizers_) {
      all_stepped = all_stepped && scaler_->state_of(o->optimizer()) == amp::OptState::Stepped;
    }
    if (all_stepped) scaler_->update();
  }
  step_skipped_ = !stepped;
  // One step per iteration, however many optimizers (the first prepared one counts).
  if (optimizers_.empty() || &optimizer == &optimizers_.front()->optimizer()) ++completed_steps_;
  return stepped;
}

void Accelerator::zero_grad(torch::optim::Optimizer& optimizer) {
  if (!sync_gradients_) return;
  // Every parameter's gradient, also those of parameters a sharded optimizer does not hold.
  if (zero::DistributedOptimizer* prepared = prepared_of(optimizer)) {
    prepared->zero_grad();
  } else {
    optimizer.zero_grad();
  }
}

double Accelerator::clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  if (!sync_gradients_) return 0.0;
  // Unscale once, here; step() sees the optimizer already unscaled (accelerate#641 unscaled twice).
  if (scaler_) {
    for (const auto& o : optimizers_) {
      if (scaler_->state_of(o->optimizer()) == amp::OptState::Ready) scaler_->unscale(o->optimizer());
    }
  }
  bool whole_everywhere = true;
  const zero::GradientPieces pieces = gradient_pieces(parameters, whole_everywhere);
  return zero::clip_grad_norm(pieces, whole_everywhere || !pg_ ? nullptr : pg_.get(), max_norm, norm_type);
}

// Note [Clipping over layouts]
// Each gradient goes to zero::clip_grad_norm (Note [One norm over pieces]) as its layout places it:
// FSDP's shard's gradient (rows of the parameter, or of its tensor-parallel part), ZeRO-2's flat
// slices, or the parameter's own gradient, whole or tensor parallelism's part. Each counts where
// its layout counts it (Layout::counts: one copy over the job; under HSDP the first replica's),
// ZeRO-1's where its owner keeps it. The model is cut when some gradient is a piece (FSDP, ZeRO-2)
// or tensor or pipeline parallelism split it (the plan's tp_size or pp_size above 1, whichever
// parameters are given); where every process holds every gradient whole and the same (one
// process, DataParallel, DDP without ZeRO) each takes torch's norm alone, no collective. Under
// HSDP the norm is summed over every process (exact zeros from the other replicas), not over one
// replica's shard group: with more than two shards the double sum may add in another order.
zero::GradientPieces Accelerator::gradient_pieces(const std::vector<at::Tensor>& parameters,
                                                  bool& whole_everywhere) const {
  zero::GradientPieces pieces;
  // Pipeline stages hold different parameters (one stage holds them all); tensor parallelism's
  // copies of a whole parameter count once, on the first tensor-parallel rank, as its cut ones.
  pieces.cut = plan_.pp > 1 || plan_.tp > 1;
  whole_everywhere = !pieces.cut;
  for (const auto& p : parameters) {
    const ModelEntry* sharded = nullptr;
    for (const auto& m : models_) {
      if (m.fsdp && m.fsdp->spec_of(p)) sharded = &m;
    }
    if (sharded) {
      const auto spec = sharded->fsdp->spec_of(p);
      const comm::Layout layout =
          layout_of(p, spec->shape, sharded->tp, std::make_pair(spec->first_row, spec->owned_rows));
      pieces.add(sharded->fsdp->shard_of(p).grad(), layout.counts(), p);
      pieces.cut = true;
      continue;
    }
    TANDEM_CHECK(plan_.strategy != Strategy::Fsdp, "clip_grad_norm: a tensor of shape ", p.sizes(),
                 " is no parameter of a prepared model: under FSDP its gradient lives on a shard");
    std::optional<std::vector<at::Tensor>> slices;  // ZeRO-2's
    int owner = -1;                                  // ZeRO-1's
    for (const auto& o : optimizers_) {
      if (zero::PartitionedOptimizer* partitioned = o->partitioned(); partitioned && !slices) {
        slices = partitioned->gradient_pieces(p);
      }
      if (owner < 0) owner = o->owner_of(p);
    }
    if (slices) {
      for (const auto& slice : *slices) pieces.add(slice, true, p);
      if (slices->empty()) pieces.add({}, false, p);  // none here: the parameter's device, for the all-reduce
      pieces.cut = true;
    } else if (owner >= 0) {
      zero::add_owned_gradient(pieces, p, owner, data_parallel_rank());
      whole_everywhere = false;
    } else {
      const comm::Layout layout = layout_of(p, p.sizes().vec(), tp_cut_of(p), std::nullopt);
      pieces.add(p.grad(), layout.counts(), p);
      if (!layout.whole()) pieces.cut = true;
    }
  }
  if (pieces.cut) whole_everywhere = false;
  return pieces;
}

Accelerator::TensorParallelCut Accelerator::parallelize(torch::nn::Module& module, const tp::Plan* plan) {
  if (plan_.tp == 1) return {};
  TANDEM_CHECK(plan, "prepare_model: tp_size ", plan_.tp, " cuts the model's layers by a plan: call "
               "prepare_model(model, plan) (tandem/tp/parallelize.h)");
  const tp::Layout layout = tp::parallelize(module, (*mesh_)["tp"], *plan);
  const auto params = module.named_parameters(true);
  TensorParallelCut cut;
  cut.rank = layout.group->rank();
  cut.size = layout.group->size();
  for (const auto& [name, placement] : layout.placements) {
    if (!placement.is_shard()) continue;
    const at::Tensor& param = params[name];
    cut.dims[param.unsafeGetTensorImpl()] = placement.dim < 0 ? placement.dim + param.dim() : placement.dim;
  }
  return cut;
}

// ---- utilities ------------------------------------------------------------------------------------

void Accelerator::wait_for_everyone() {
  if (pg_ && pg_->size() > 1) pg_->barrier();
}

at::Tensor Accelerator::gather(const at::Tensor& tensor) { return gather_over(pg_.get(), tensor); }

at::Tensor Accelerator::gather_over(comm::ProcessGroup* group, const at::Tensor& tensor) {
  if (!group || group->size() == 1) return tensor;
  at::Tensor local = tensor.contiguous();
  const bool cpu_only = !group->has_nccl() && local.is_cuda();
  if (cpu_only) local = local.cpu();
  auto parts = group->all_gather(local);
  return at::cat(parts, 0).to(tensor.device());
}

at::Tensor Accelerator::reduce(const at::Tensor& tensor, comm::ReduceOp op) {
  at::Tensor result = tensor.clone();
  if (pg_ && pg_->size() > 1) pg_->all_reduce(result, op);
  return result;
}

// Rank r's i-th sample of this round sits at position first_sample + i * W + r of the epoch's
// padded order (Note [Loader position]); positions from the dataset size on are the repeated ones.
// W counts the data-parallel ranks: a tensor-parallel group's ranks share their samples.
at::Tensor Accelerator::gather_for_metrics(const at::Tensor& tensor) {
  TANDEM_CHECK(tensor.dim() > 0, "gather_for_metrics: the tensor needs a batch dimension (dim 0)");
  at::Tensor all = gather_over(data_parallel_group().get(), tensor);
  const int W = data_parallel_size();
  if (W == 1 || !last_batch_) return all;
  const auto& p = *last_batch_;
  const int64_t rows = tensor.size(0);
  // [W, rows, ...] -> [rows, W, ...] -> [rows * W, ...]: the sampler's order.
  std::vector<int64_t> shape{W, rows};
  for (int64_t d = 1; d < tensor.dim(); ++d) shape.push_back(tensor.size(d));
  at::Tensor ordered = all.reshape(shape).transpose(0, 1).reshape(all.sizes());
  const int64_t keep = std::max<int64_t>(0, std::min<int64_t>(rows * W, p.dataset_size - p.first_sample));
  return ordered.narrow(0, 0, keep);
}

MainProcessFirst::MainProcessFirst(Accelerator& accelerator)
    : accelerator_(&accelerator), exceptions_(std::uncaught_exceptions()) {
  if (!accelerator.is_main_process()) accelerator.wait_for_everyone();  // the main process runs first
}

MainProcessFirst::~MainProcessFirst() noexcept(false) {
  // Releases the others, unless the main process's block is throwing: then they must not go on
  // as if it had succeeded; they fail at the collective timeout instead.
  if (accelerator_ && accelerator_->is_main_process() && std::uncaught_exceptions() == exceptions_) {
    accelerator_->wait_for_everyone();
  }
}

std::pair<int64_t, int64_t> Accelerator::share_of(int64_t n) const {
  // A tensor-parallel group shares its items, as its batches.
  const int64_t W = data_parallel_size(), r = data_parallel_rank();
  const int64_t base = n / W, extra = n % W;
  const int64_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

void Accelerator::log(const std::map<std::string, double>& values, int64_t step) {
  if (!is_main_process() || options_.project_dir().empty()) return;
  ::mkdir(options_.project_dir().c_str(), 0755);
  nlohmann::json line;
  line["step"] = step;
  for (const auto& [key, value] : values) line[key] = value;
  std::ofstream out(options_.project_dir() + "/metrics.jsonl", std::ios::app);
  TANDEM_CHECK(out.good(), "log: cannot append to ", options_.project_dir(), "/metrics.jsonl");
  out << line.dump() << "\n";
}

}  // namespace tandem
