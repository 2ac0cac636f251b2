#pragma once
// Accelerator: one training loop for 1 CPU, 1 GPU, N GPUs and N nodes (docs/guide-accelerate.md),
// in the spirit of Hugging Face accelerate.
//
// Example:
//   tandem::Accelerator acc(tandem::AcceleratorOptions().gradient_accumulation_steps(2));
//   auto model = acc.prepare_model(Net());
//   torch::optim::SGD opt(model->parameters(), 0.1);
//   acc.prepare_optimizer(opt);
//   auto loader = acc.prepare_data(images, labels, /*batch_size=*/64);
//   for (int epoch = 0; epoch < 3; ++epoch) {
//     for (auto& batch : loader) {
//       auto sync = acc.accumulate(model);
//       auto loss = at::cross_entropy_loss(model->forward(batch.data), batch.target);
//       acc.backward(loss);
//       acc.clip_grad_norm(model->parameters(), 1.0);
//       acc.step(opt);
//       acc.zero_grad(opt);
//     }
//   }
//   acc.save_state("checkpoints");
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "tandem/accelerate/data_loader.h"
#include "tandem/accelerate/options.h"
#include "tandem/accelerate/prepared_model.h"
#include "tandem/accelerate/prepared_pipeline.h"
#include "tandem/accelerate/progress.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/comm/device_mesh.h"
#include "tandem/comm/layout.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/world.h"
#include "tandem/fsdp/sharded_parameters.h"
#include "tandem/tp/random.h"
#include "tandem/tp/style.h"
#include "tandem/zero/clip_grad_norm.h"
#include "tandem/zero/distributed_optimizer.h"

namespace torch::optim {
class Optimizer;
}

namespace tandem {

class Accelerator;
namespace accelerate {
struct ChunkPiece;  // src/accelerate/sharded_tensors.h: what a checkpoint writes of a tensor
class CheckpointReader;
}

/// A tensor of a prepared model as Accelerator::layouts gives it (DTensor's placements and
/// to_local()): its name in the module, its layout, and what this process holds of it (a view:
/// the parameter itself, or FSDP's rows of it, [owned rows, shape[1:]...]).
struct LaidOutTensor {
  std::string name;
  comm::Layout layout;
  at::Tensor local;
};

/// The scope of one batch under gradient accumulation (Accelerator::accumulate).
class AccumulateScope {
 public:
  ~AccumulateScope();
  AccumulateScope(AccumulateScope&& other) noexcept;
  AccumulateScope(const AccumulateScope&) = delete;
  AccumulateScope& operator=(const AccumulateScope&) = delete;
  AccumulateScope& operator=(AccumulateScope&&) = delete;

 private:
  friend class Accelerator;
  explicit AccumulateScope(std::function<void(bool)> set_sync) : set_sync_(std::move(set_sync)) {}
  std::function<void(bool)> set_sync_;
};

/// Non-main processes wait until the main process has run the scope's body (and the reverse).
class MainProcessFirst {
 public:
  ~MainProcessFirst() noexcept(false);
  MainProcessFirst(MainProcessFirst&& other) noexcept
      : accelerator_(std::exchange(other.accelerator_, nullptr)), exceptions_(other.exceptions_) {}
  MainProcessFirst(const MainProcessFirst&) = delete;
  MainProcessFirst& operator=(const MainProcessFirst&) = delete;

 private:
  friend class Accelerator;
  explicit MainProcessFirst(Accelerator& accelerator);
  Accelerator* accelerator_;
  int exceptions_;  // std::uncaught_exceptions() at construction
};

class Accelerator {
 public:
  /// Reads the launch environment (tandem::comm::World), binds this rank's GPU, picks the
  /// strategy and creates the process group it needs, which the Accelerator owns.
  explicit Accelerator(AcceleratorOptions options = {});
  /// The same over a process group the program already has (its world is the job's).
  explicit Accelerator(std::shared_ptr<comm::ProcessGroup> process_group, AcceleratorOptions options = {});
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // ---- where we are ------------------------------------------------------------------------
  const comm::World& world() const { return world_; }
  int process_index() const { return world_.rank; }
  int num_processes() const { return world_.world_size; }
  bool is_main_process() const { return world_.is_main(); }
  bool is_local_main_process() const { return world_.is_local_main(); }
  /// Where prepared models and batches live: cuda:LOCAL_RANK when a GPU is visible, else cpu.
  const c10::Device& device() const { return device_; }
  Strategy strategy() const { return plan_.strategy; }
  /// One line: the strategy chosen and why ("ddp: 2 processes launched by torchrun / tandem run").
  const std::string& strategy_reason() const { return reason_; }
  /// The process group (null for a single process without DDP). The Accelerator owns it.
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return pg_; }
  /// The layout the processes train in (AcceleratorOptions::parallelism, resolved).
  const ParallelismPlan& parallelism() const { return plan_; }
  /// The mesh ("replicate", "shard", "tp") under tensor parallelism, ("replicate", "shard") under
  /// HSDP; null otherwise (every group is the process group).
  const comm::DeviceMesh* device_mesh() const { return mesh_ ? &*mesh_ : nullptr; }
  /// The tensor-parallel group (tp_size > 1; null otherwise): tp::cross_entropy's group.
  std::shared_ptr<comm::ProcessGroup> tensor_parallel_group() const {
    return plan_.tp > 1 ? mesh_->group("tp") : nullptr;
  }
  /// The processes that see different data, and this one's index among them: the data is sharded
  /// over them (a tensor-parallel group shares its batches, a pipeline's stages too). The mesh is
  /// ("pp", "replicate", "shard", "tp") row-major (Note [Parallelism plan]).
  int data_parallel_size() const { return world_.world_size / (plan_.tp * plan_.pp); }
  int data_parallel_rank() const { return (world_.rank / plan_.tp) % data_parallel_size(); }
  /// This process's data-parallel rank, tensor-parallel rank and pipeline stage (what seeds its
  /// generators: tandem/tp/random.h; the stage from prepare_pipeline on).
  tp::ParallelRanks parallel_ranks() const { return {data_parallel_rank(), world_.rank % plan_.tp, pipeline_rank()}; }
  /// Pipeline parallelism (pp_size; docs/guide-pp.md): how many processes one pipeline's stages
  /// run on, this process's place among them, and their group (under pp_size 1, a group of this
  /// process alone, made on first use: collective then).
  int pipeline_size() const { return plan_.pp; }
  int pipeline_rank() const { return plan_.pp > 1 ? static_cast<int>(mesh_->local_rank("pp")) : 0; }
  std::shared_ptr<comm::ProcessGroup> pipeline_group();
  /// The stages this process runs when the model is cut into `stages` (a multiple of pp_size):
  /// pipeline_rank(), + pp_size, + 2 pp_size, ... (one when `stages` is pp_size).
  std::vector<int> pipeline_stages(int stages) const;
  const AcceleratorOptions& options() const { return options_; }

  // ---- prepare -----------------------------------------------------------------------------
  /// Moves the module to device() and wraps it for the strategy; the returned holder keeps
  /// the user's type (`model->module()`).
  template <typename ModuleHolder>
  PreparedModel<ModuleHolder> prepare_model(ModuleHolder module) {
    return prepare(std::move(module), nullptr);
  }
  /// The same with a tensor-parallel plan: under tp_size > 1 the model's layers are cut over the
  /// tensor-parallel group first (tp::parallelize; docs/guide-tp.md); under tp_size 1 the plan is
  /// not used, so one program runs at any tp_size.
  template <typename ModuleHolder>
  PreparedModel<ModuleHolder> prepare_model(ModuleHolder module, const tp::Plan& plan) {
    return prepare(std::move(module), &plan);
  }
  /// Pipeline parallelism: `stages` are this process's parts of the model, the stages
  /// pipeline_stages(stages.size() x pp_size) in that order (each module's forward takes one
  /// tensor and returns one). Each is prepared as prepare_model prepares a model (DDP or FSDP over
  /// the data-parallel dimensions, autocast); the returned pipeline's step(inputs, targets) runs
  /// the forward and backward of a whole batch in microbatches (options: the schedule, how many),
  /// `loss` on the last stage's output of each. Collective. One line for what it cannot compose:
  /// fp16's loss scaling, gradient_accumulation_steps > 1 (the microbatches accumulate already),
  /// zero_stage, several stages per process outside Interleaved1F1B.
  template <typename ModuleHolder>
  PreparedPipeline<ModuleHolder> prepare_pipeline(std::vector<ModuleHolder> stages, pp::LossFn loss,
                                                  PipelineOptions options = {});
  /// Registers an optimizer for clip_grad_norm's unscaling and for save_state/load_state; with
  /// zero_stage(1) over several processes, shards it (each process then keeps state for, and
  /// steps, its share of the parameters: step() and zero_grad() go through the Accelerator);
  /// with zero_stage(2), its model's gradients too (prepare the model first).
  void prepare_optimizer(torch::optim::Optimizer& optimizer);
  /// A LibTorch dataset read in batches of `batch_size` per process, sharded and reshuffled per
  /// epoch (Note [Loader position]); batches are moved to device() by the caller's forward.
  template <typename Dataset>
  accelerate::PreparedLoader<Dataset> prepare_data(Dataset dataset, int64_t batch_size, bool shuffle = true);
  /// Plain tensors, indexed together along dim 0.
  accelerate::PreparedLoader<accelerate::TensorPairDataset> prepare_data(at::Tensor data, at::Tensor targets,
                                                                         int64_t batch_size, bool shuffle = true);

  // ---- the loop ----------------------------------------------------------------------------
  /// One batch under gradient accumulation: gradients are synchronised (and step() steps) on
  /// every gradient_accumulation_steps-th batch and on the last batch of the data.
  template <typename ModuleHolder>
  [[nodiscard]] AccumulateScope accumulate(PreparedModel<ModuleHolder>& model) {
    begin_accumulation_step();
    PreparedModelImpl<ModuleHolder>* impl = model.get();
    impl->set_require_backward_grad_sync(sync_gradients_);
    return AccumulateScope([impl](bool enabled) { impl->set_require_backward_grad_sync(enabled); });
  }
  /// loss / gradient_accumulation_steps, scaled under fp16, then backward.
  void backward(const at::Tensor& loss);
  /// optimizer.step() when gradients were synchronised in this batch (skipped on every rank
  /// when fp16 found inf/NaN on any rank). Returns whether the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer);
  /// optimizer.zero_grad() when gradients were synchronised in this batch.
  void zero_grad(torch::optim::Optimizer& optimizer);
  /// Clips the gradients' total norm to `max_norm` when gradients were synchronised (unscaling
  /// them first under fp16, exactly once); returns the norm before clipping (the same on every
  /// rank), or 0 between synchronisations, when it does nothing.
  double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0);
  /// Whether this batch synchronises gradients (and steps).
  bool sync_gradients() const { return sync_gradients_; }
  /// Whether the last step() skipped the optimizer (fp16 inf/NaN).
  bool optimizer_step_was_skipped() const { return step_skipped_; }
  /// Optimizer steps taken (skipped fp16 steps included), the step counter of checkpoints.
  int64_t completed_steps() const { return completed_steps_; }
  /// Whether this job was started again: its launcher restarted the workers (tandem run or
  /// torchrun --max-restarts) or Slurm requeued it. Such a job goes on from its newest checkpoint
  /// (load_state_if_any) instead of starting afresh (docs/cluster.md; the examples do).
  bool restarted() const { return world_.restart_count > 0 || world_.requeue_count > 0; }
  /// Note [Stopping on a signal]: from this call on, SIGTERM and SIGINT no longer end the process
  /// at once; they set a flag that stop_requested() reads, so that the loop can save a checkpoint
  /// and return within the launcher's grace period (Slurm's preemption, an elastic job's next
  /// round, Ctrl-C). A second signal of the same kind ends the process as it would have.
  void handle_stop_signals();
  /// Whether a stop signal reached any process (after handle_stop_signals()): the same answer on
  /// every process, so that all stop after the same step. Collective (a one-int all-reduce) once
  /// handle_stop_signals() was called; false without a collective before.
  bool stop_requested();
  /// The signal stop_requested() answered for (on every process), 0 when none: a program exits
  /// 128 + it after saving, as a process killed by it would.
  int stop_signal() const { return stop_signal_; }
  /// Where every parameter and buffer of a prepared model lies across the processes (Note
  /// [Layouts], tandem/comm/layout.h): by name, as the module names them, the mesh ("replicate",
  /// "shard", "tp") of this process's pipeline stage, one placement per dimension, the whole
  /// shape and this process's box. A gradient lies as its parameter; FSDP's optimizer state too.
  template <typename ModuleHolder>
  std::vector<LaidOutTensor> layouts(const PreparedModel<ModuleHolder>& model) const {
    return layouts_of(model.ptr().get());
  }
  /// A prepared model's whole tensors by name (accelerate's get_state_dict; FSDP2's full_tensor()
  /// of each): its parameters, then its buffers, as CPU tensors assembled bit for bit from the
  /// boxes the processes hold (Note [Whole tensors from boxes]), in the dtype they keep them. On
  /// the main process; empty elsewhere unless `on_every_process`. A pipeline stage's model gives
  /// the whole pipeline's: every stage's tensors, stage by stage. Collective: every process calls it.
  template <typename ModuleHolder>
  std::vector<std::pair<std::string, at::Tensor>> get_state_dict(const PreparedModel<ModuleHolder>& model,
                                                                  bool on_every_process = false) {
    return state_dict_of(model.ptr().get(), on_every_process);
  }
  /// The user's module of a prepared model.
  template <typename ModuleHolder>
  ModuleHolder& unwrap(PreparedModel<ModuleHolder>& model) { return model->module(); }
  /// The scaler under fp16 (null otherwise).
  amp::GradScaler* scaler() { return scaler_.get(); }

  // ---- utilities ---------------------------------------------------------------------------
  /// printf on the main process only.
  template <typename... Args>
  void print(const char* format, Args... args) const {
    if (!is_main_process()) return;
    std::printf(format, args...);
    std::fflush(stdout);
  }
  /// A barrier that fails after collective_timeout naming itself, instead of hanging.
  void wait_for_everyone();
  /// Every process's tensor, concatenated along dim 0 in rank order.
  at::Tensor gather(const at::Tensor& tensor);
  /// Sum (or another op) of every process's tensor.
  at::Tensor reduce(const at::Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::Sum);
  /// gather() of one batch's results from the loader being iterated, in the data's order, with
  /// the samples the sampler repeated to even out the last round dropped: over an epoch without
  /// shuffle, exactly the dataset, in order.
  at::Tensor gather_for_metrics(const at::Tensor& tensor);
  /// `{ auto first = acc.main_process_first(); ... }`: the main process runs the block before
  /// the others (e.g. to unpack a dataset once).
  [[nodiscard]] MainProcessFirst main_process_first() { return MainProcessFirst(*this); }
  /// This process's contiguous share of `items` (the first processes get one more when they do
  /// not divide evenly); under tensor parallelism, its data-parallel rank's share (a group shares).
  template <typename T>
  std::vector<T> split_between_processes(const std::vector<T>& items) const {
    const auto [begin, end] = share_of(static_cast<int64_t>(items.size()));
    return std::vector<T>(items.begin() + begin, items.begin() + end);
  }
  /// A progress line for `total_steps` steps, drawn by the main process only (when the
  /// `progress` option is on).
  accelerate::ProgressBar progress_bar(int64_t total_steps, const std::string& label) const {
    return accelerate::ProgressBar(total_steps, label, is_main_process() && options_.progress());
  }
  /// Appends {"step": step, values...} as one JSON line to project_dir/metrics.jsonl (main
  /// process only; nothing without project_dir).
  void log(const std::map<std::string, double>& values, int64_t step);

  // ---- checkpoints (docs/checkpoints.md) -----------------------------------------------------
  /// Extra state saved with save_state: `save` returns bytes, `load` receives them.
  void register_for_checkpointing(const std::string& name, std::function<std::string()> save,
                                  std::function<void(const std::string&)> load);
  /// Keep at most this many checkpoints under a save_state root (0: all).
  void set_total_limit(int limit) { total_limit_ = limit; }
  /// Writes `root/checkpoint_<step>` (crash-safe: temporary folder, fsync, rename) and returns
  /// its path: the prepared models' weights (safetensors), the optimizers, the scaler, every
  /// rank's RNG states, the loop position (step, epoch, batch within the epoch) and registered
  /// objects. Every process calls it.
  std::string save_state(const std::string& root);
  /// Restores what save_state wrote from a checkpoint folder (or from the newest under a root).
  void load_state(const std::string& path);
  /// Auto-resume (Note [Auto-resume]): restores the newest committed checkpoint under `root` and
  /// returns its path, or returns nothing when `root` holds none (or does not exist) — the same
  /// answer on every process, or every process throws. Every process calls it.
  std::optional<std::string> load_state_if_any(const std::string& root);

 private:
  friend class MainProcessFirst;
  bool handling_stop_signals_ = false;
  int stop_signal_ = 0;
  using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
  /// Which parameters tensor parallelism cut, along which dimension, over how many ranks (this
  /// rank's place among them): what turns a local tensor into its box of the whole.
  struct TensorParallelCut {
    std::map<const c10::TensorImpl*, int64_t> dims;  // a cut parameter -> its Shard dimension
    int rank = 0, size = 1;
  };
  /// One tensor of a prepared model in a checkpoint: its name, dtype and layout (this rank's box).
  struct ModelSlot {
    std::string name;
    at::ScalarType dtype = at::kFloat;
    comm::Layout layout;
  };
  struct ModelEntry {
    std::function<NamedTensors()> identities;          // the module's own tensors by name (names the optimizer's)
    std::function<std::vector<ModelSlot>()> layout;    // what a checkpoint holds of it, no collective
    std::function<NamedTensors()> held;                // per slot, what this rank holds (whole, or its rows)
    std::function<void(const NamedTensors&)> load;     // sets the model from per-slot tensors like held()'s
    ddp::Reducer* reducer = nullptr;  // its DDP's, under Strategy::Ddp
    std::shared_ptr<fsdp::ShardedParameters> fsdp;  // its FSDP's shards, under Strategy::Fsdp
    TensorParallelCut tp;  // its parameters tensor parallelism cut
    std::shared_ptr<torch::nn::Module> owner;  // keeps those alive as long as the Accelerator
    bool stage = false;  // a pipeline stage's (prepare_pipeline): Note [Pipeline checkpoints]
  };
  struct LoaderEntry {
    std::function<std::pair<int64_t, int64_t>()> position;  // (epoch, samples_done)
    std::function<void(int64_t, int64_t)> resume;
    int64_t dataset_size = 0;
  };

  void initialize();
  template <typename ModuleHolder>
  PreparedModel<ModuleHolder> prepare(ModuleHolder module, const tp::Plan* plan);
  /// Cuts `module` by `plan` over the tensor-parallel group (tp_size > 1); returns the parameters
  /// cut. One line when tp_size > 1 comes without a plan.
  TensorParallelCut parallelize(torch::nn::Module& module, const tp::Plan* plan);
  /// Note [Layouts] (accelerator.cpp): the layout of a prepared model's tensor `param` whose local
  /// shape is `local_shape` (after tensor parallelism cut it, when `cut` names it), under FSDP
  /// holding rows [first_row, first_row + count) of that (checked against the placements' rule).
  comm::Layout layout_of(const at::Tensor& param, const std::vector<int64_t>& local_shape,
                         const TensorParallelCut& cut, std::optional<std::pair<int64_t, int64_t>> rows) const;
  /// The cut of the parameter's model (every parameter's is the same rank and size).
  const TensorParallelCut& tp_cut_of(const at::Tensor& param) const;
  /// prepare_pipeline's one-line refusals, before anything is prepared.
  void check_pipeline(size_t stages, const PipelineOptions& options) const;
  /// The refusals that depend on the AcceleratorOptions alone (`who` leads the line).
  void check_pipeline_options(const std::string& who) const;
  /// From here on each pipeline stage draws its own random numbers (Note [Seeds per stage]).
  void seed_stage();
  /// Each parameter's gradient as its layout places it (Note [Clipping over layouts]);
  /// `whole_everywhere`: whether every process holds every one whole and the same.
  zero::GradientPieces gradient_pieces(const std::vector<at::Tensor>& parameters, bool& whole_everywhere) const;
  at::Tensor gather_over(comm::ProcessGroup* group, const at::Tensor& tensor);
  fsdp::FullyShardOptions fsdp_options(torch::nn::Module& model) const;
  /// activation_checkpointing under Single and Ddp (FSDP's own option does it under Fsdp).
  void checkpoint_activations(torch::nn::Module& model) const;
  /// The groups the strategies reduce over: DDP's and ZeRO's (every process but for tensor
  /// parallelism's: the mesh's "replicate" x "shard"), FSDP's shards (the mesh's "shard").
  std::shared_ptr<comm::ProcessGroup> data_parallel_group() const { return dp_group_ ? dp_group_ : pg_; }
  std::shared_ptr<comm::ProcessGroup> shard_group() const { return mesh_ ? mesh_->group("shard") : pg_; }
  /// The parameters, then the buffers, each with its layout.
  std::vector<ModelSlot> model_layout(const fsdp::ShardedParameters* engine, torch::nn::Module& module,
                                      const TensorParallelCut& cut) const;
  /// get_state_dict of the prepared model `owner` (state_dict.cpp).
  NamedTensors state_dict_of(const torch::nn::Module* owner, bool on_every_process);
  /// The model_layout of the prepared model `owner` as Accelerator::layouts gives it.
  std::vector<LaidOutTensor> layouts_of(const torch::nn::Module* owner) const;
  /// What this rank holds of each slot of model_layout: the tensor, or its shard's rows.
  static NamedTensors model_held(const fsdp::ShardedParameters* engine, torch::nn::Module& module);
  /// Copies per-slot tensors by name into the module (rows into its shards under FSDP).
  static void load_model(fsdp::ShardedParameters* engine, torch::nn::Module& module, const NamedTensors& held);
  void choose_strategy();
  void begin_accumulation_step();
  void on_batch(const accelerate::LoaderProgress& progress);
  std::pair<int64_t, int64_t> share_of(int64_t n) const;
  data::DistributedSamplerOptions sampler_options(bool shuffle) const;
  std::optional<size_t> index_of(const torch::optim::Optimizer& optimizer) const;  // in optimizers_
  /// The prepared optimizer that holds `optimizer`, or null.
  zero::DistributedOptimizer* prepared_of(const torch::optim::Optimizer& optimizer) const;
  // Checkpoints (accelerator_state.cpp): each prepared model's named tensors, optimizer o's param
  // groups (every parameter, also those other ranks own) and the parameters whose state it holds.
  std::vector<NamedTensors> model_identities() const;
  /// The models a checkpoint holds, as indices into models_: each prepared model alone, or a
  /// pipeline's stages together as one model (Note [Pipeline checkpoints]).
  std::vector<std::vector<size_t>> checkpoint_models() const;
  bool has_pipeline() const;
  std::vector<std::vector<at::Tensor>> optimizer_groups(size_t o) const;
  std::vector<at::Tensor> held_parameters(size_t o) const;
  /// The pieces of a checkpoint's model (`members`: models_ indices), and whether they make one
  /// file, or of optimizer `o`'s state, that this process writes (Note [One save path]).
  std::vector<accelerate::ChunkPiece> model_pieces(const std::vector<size_t>& members, bool& one_file) const;
  /// The tensors of models `members` whose copy here is the one that counts (Layout::counts), with
  /// their slots: what a checkpoint writes and get_state_dict assembles.
  std::vector<std::pair<ModelSlot, at::Tensor>> counted_tensors(const std::vector<size_t>& members) const;
  std::vector<accelerate::ChunkPiece> optimizer_pieces(size_t o, const std::unordered_map<const void*, std::string>& names);
  /// Whether optimizer `o`'s state is saved one file per rank (sharded by parameter or by rows, or
  /// laid out by tensor or pipeline parallelism), or whole in one file by the main process.
  bool state_per_rank(size_t o) const;
  // load_state's steps (Note [Loading all or nothing]): read and check, then apply.
  struct StagedCheckpoint;
  void stage_shape(const accelerate::CheckpointReader& reader, StagedCheckpoint& staged) const;
  void stage_models(const accelerate::CheckpointReader& reader, StagedCheckpoint& staged) const;
  void stage_optimizers(const accelerate::CheckpointReader& reader, StagedCheckpoint& staged);
  void stage_progress(const accelerate::CheckpointReader& reader, StagedCheckpoint& staged) const;
  void apply(StagedCheckpoint& staged);
  template <typename Dataset>
  void register_loader(accelerate::PreparedLoader<Dataset>& loader);

  AcceleratorOptions options_;
  comm::World world_;
  c10::Device device_{c10::kCPU};
  std::string reason_;
  ParallelismPlan plan_{Strategy::Single};  // its strategy is the one chosen (never Auto after construction)
  std::shared_ptr<comm::ProcessGroup> pg_;
  std::optional<comm::DeviceMesh> mesh_;
  std::shared_ptr<comm::ProcessGroup> dp_group_;  // "replicate" x "shard" flattened, under tensor parallelism
  std::shared_ptr<comm::ProcessGroup> pipeline_group_;  // pp_size 1: this process alone
  std::unique_ptr<amp::GradScaler> scaler_;
  // Note [One optimizer interface]: whole, ZeRO-1, ZeRO-2 or FSDP, in the order prepared.
  std::vector<std::unique_ptr<zero::DistributedOptimizer>> optimizers_;
  std::vector<ModelEntry> models_;
  std::vector<LoaderEntry> loaders_;
  std::vector<std::tuple<std::string, std::function<std::string()>, std::function<void(const std::string&)>>> custom_;
  int total_limit_ = 0;

  // Gradient accumulation (accelerate's GradientState).
  bool sync_gradients_ = true;
  int64_t accumulation_step_ = 0;
  bool end_of_data_ = false;
  bool step_skipped_ = false;
  int64_t completed_steps_ = 0;
  std::optional<accelerate::LoaderProgress> last_batch_;
};

// ---- templates -------------------------------------------------------------------------------

template <typename ModuleHolder>
PreparedModel<ModuleHolder> Accelerator::prepare(ModuleHolder module, const tp::Plan* plan) {
  using Impl = PreparedModelImpl<ModuleHolder>;
  module->to(device_);
  TensorParallelCut tp_cut = parallelize(*module, plan);
  if (options_.activation_checkpointing() && plan_.strategy != Strategy::Fsdp) checkpoint_activations(*module);
  std::optional<typename Impl::Ddp> ddp;
  std::optional<typename Impl::Dp> dp;
  std::optional<typename Impl::Fsdp> fully_sharded;
  if (plan_.strategy == Strategy::Ddp) {
    ddp.emplace(module, data_parallel_group(), options_.ddp());
  } else if (plan_.strategy == Strategy::DataParallel) {
    dp.emplace(module, options_.dp());
  } else if (plan_.strategy == Strategy::Fsdp) {
    fully_sharded.emplace(module, shard_group(), fsdp_options(*module));
  }
  std::optional<typename Impl::Autocast> autocast;
  if (options_.mixed_precision() != Precision::No) {
    autocast = typename Impl::Autocast{device_.type(),
                                       options_.mixed_precision() == Precision::Fp16 ? at::kHalf : at::kBFloat16};
  }
  ddp::Reducer* reducer = ddp ? &(*ddp)->reducer() : nullptr;  // before the holders move
  std::shared_ptr<fsdp::ShardedParameters> engine = fully_sharded ? (*fully_sharded)->sharded_parameters() : nullptr;
  PreparedModel<ModuleHolder> prepared(
      std::make_shared<Impl>(module, std::move(ddp), std::move(dp), std::move(fully_sharded), autocast));
  ModelEntry entry;
  entry.identities = [module]() {
    NamedTensors state;
    for (const auto& item : module->named_parameters(true)) state.emplace_back(item.key(), item.value());
    for (const auto& item : module->named_buffers(true)) state.emplace_back(item.key(), item.value());
    return state;
  };
  entry.layout = [this, engine, module, tp_cut]() { return model_layout(engine.get(), *module.ptr(), tp_cut); };
  entry.held = [engine, module]() { return model_held(engine.get(), *module.ptr()); };
  entry.load = [engine, module](const NamedTensors& held) { load_model(engine.get(), *module.ptr(), held); };
  entry.reducer = reducer;
  entry.fsdp = engine;
  entry.tp = std::move(tp_cut);
  entry.owner = prepared.ptr();
  models_.push_back(std::move(entry));
  return prepared;
}

template <typename ModuleHolder>
PreparedPipeline<ModuleHolder> Accelerator::prepare_pipeline(std::vector<ModuleHolder> stages, pp::LossFn loss,
                                                             PipelineOptions options) {
  check_pipeline(stages.size(), options);
  const std::shared_ptr<comm::ProcessGroup> group = pipeline_group();
  const std::vector<int> indices = pipeline_stages(static_cast<int>(stages.size()) * plan_.pp);
  std::vector<PreparedModel<ModuleHolder>> models;
  std::vector<std::unique_ptr<pp::Stage>> prepared_stages;
  for (size_t k = 0; k < stages.size(); ++k) {
    PreparedModel<ModuleHolder> model = prepare(std::move(stages[k]), nullptr);
    auto* impl = model.ptr().get();
    pp::DataParallelSync sync;
    if (impl->synchronises()) {
      sync.require = [impl](bool on) { impl->set_require_backward_grad_sync(on); };
      sync.arm = [impl](const at::Tensor& output) { impl->prepare_for_backward({output}); };
    }
    prepared_stages.push_back(std::make_unique<pp::Stage>(
        model.ptr(), [impl](const at::Tensor& x) -> at::Tensor { return impl->forward(x); }, indices[k],
        static_cast<int>(stages.size()) * plan_.pp, group, std::move(sync)));
    models_.back().stage = true;
    models.push_back(std::move(model));
  }
  seed_stage();
  const int m = options.microbatches() > 0 ? options.microbatches() : 2 * plan_.pp;
  const auto schedule_options = pp::ScheduleOptions().reduction(options.reduction()).track_memory(options.track_memory());
  std::unique_ptr<pp::Schedule> schedule;
  if (options.schedule() == PipelineSchedule::GPipe) {
    schedule = std::make_unique<pp::ScheduleGPipe>(*prepared_stages.front(), m, std::move(loss), schedule_options);
  } else if (options.schedule() == PipelineSchedule::OneFOneB) {
    schedule = std::make_unique<pp::Schedule1F1B>(*prepared_stages.front(), m, std::move(loss), schedule_options);
  } else {
    std::vector<pp::Stage*> mine;
    for (auto& s : prepared_stages) mine.push_back(s.get());
    schedule = std::make_unique<pp::ScheduleInterleaved1F1B>(mine, m, std::move(loss), schedule_options);
  }
  return PreparedPipeline<ModuleHolder>(std::move(models), std::move(prepared_stages), std::move(schedule));
}

template <typename Dataset>
void Accelerator::register_loader(accelerate::PreparedLoader<Dataset>& loader) {
  loaders_.push_back(LoaderEntry{[loader]() { return std::make_pair(loader.epoch(), loader.samples_done()); },
                                 [loader](int64_t epoch, int64_t done) mutable { loader.resume(epoch, done); },
                                 loader.dataset_size()});
}

template <typename Dataset>
accelerate::PreparedLoader<Dataset> Accelerator::prepare_data(Dataset dataset, int64_t batch_size, bool shuffle) {
  accelerate::PreparedLoader<Dataset> loader(std::move(dataset), batch_size, data_parallel_size(), data_parallel_rank(),
                                             sampler_options(shuffle),
                                             [this](const accelerate::LoaderProgress& p) { on_batch(p); });
  register_loader(loader);
  return loader;
}

}  // namespace tandem
