#include "tandem/accelerate/accelerator.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/comm/cuda_info.h"
#include "tandem/error.h"
#include "tandem/host_allocator.h"
#include "tandem/zero/clip_grad_norm.h"

namespace tandem {
namespace {

constexpr int kStateFormat = 1;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string optimizer_bytes(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

// Every rank's `bytes`, on every rank, in rank order (lengths may differ), in pieces of 64 MiB
// (the MPI backend gathers at most 128 MiB per rank at once).
std::vector<std::string> gather_bytes(comm::ProcessGroup& pg, const std::string& bytes) {
  constexpr int64_t kPiece = int64_t{64} << 20;
  const auto lengths = pg.all_gather(at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong));
  int64_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, l.item<int64_t>());
  std::vector<std::string> out(lengths.size());
  for (int64_t at = 0; at < longest; at += kPiece) {
    const int64_t n = std::min(kPiece, longest - at);
    at::Tensor mine = at::zeros({n}, at::kByte);
    const int64_t have = std::clamp<int64_t>(static_cast<int64_t>(bytes.size()) - at, 0, n);
    if (have > 0) std::memcpy(mine.data_ptr(), bytes.data() + at, static_cast<size_t>(have));
    const auto all = pg.all_gather(mine);
    for (size_t r = 0; r < all.size(); ++r) {
      const int64_t theirs = std::clamp<int64_t>(lengths[r].item<int64_t>() - at, 0, n);
      out[r].append(static_cast<const char*>(all[r].data_ptr()), static_cast<size_t>(theirs));
    }
  }
  return out;
}

std::string shard_name(size_t optimizer, int rank) {
  return "optimizer_" + std::to_string(optimizer) + ".rank" + std::to_string(rank) + ".pt";
}

}  // namespace

const char* to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::Auto: return "auto";
    case Strategy::Single: return "single";
    case Strategy::DataParallel: return "dp";
    case Strategy::Ddp: return "ddp";
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
  TANDEM_CHECK(options_.zero_stage() == 0 || options_.zero_stage() == 1, "Accelerator: zero_stage ",
               options_.zero_stage(), " is not available (0: plain DDP, 1: optimizer state sharded; stage 2, "
               "gradients sharded too, is not built yet)");
  // Before any CUDA work: this rank's GPU becomes the current device (one per rank on a node).
  comm::bind_cuda_device(world_.local_rank);
  choose_strategy();
  tune_host_allocator();  // Note [Host allocator]: every strategy, a single process included
  if (!pg_ && (world_.world_size > 1 || strategy_ == Strategy::Ddp)) {
    pg_ = comm::ProcessGroup::create(world_, comm::ProcessGroupOptions().timeout(options_.collective_timeout()));
  }
  torch::manual_seed(options_.seed() + static_cast<uint64_t>(world_.rank));
  if (options_.mixed_precision() == Precision::Fp16) {
    scaler_ = pg_ ? std::make_unique<amp::GradScaler>(pg_, options_.scaler())
                  : std::make_unique<amp::GradScaler>(options_.scaler());
  }
  print("tandem: strategy %s (%s), device %s, mixed precision %s, %d process%s\n", to_string(strategy_),
        reason_.c_str(), device_.str().c_str(), to_string(options_.mixed_precision()), world_.world_size,
        world_.world_size == 1 ? "" : "es");
}

Accelerator::~Accelerator() = default;

void Accelerator::choose_strategy() {
  const int gpus = comm::cuda_device_count();
  const int processes = world_.world_size;
  const std::string launched = std::to_string(processes) + " process" + (processes == 1 ? "" : "es") +
                               (processes > 1 ? std::string(" launched by ") + comm::to_string(world_.source) : "");
  const std::string gpu_text = gpus == 0 ? "no GPU" : std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s");
  strategy_ = options_.strategy();
  if (strategy_ == Strategy::Auto) {
    if (processes > 1) {
      strategy_ = Strategy::Ddp;
      reason_ = "auto: " + launched;
    } else if (gpus > 1) {
      strategy_ = Strategy::DataParallel;
      reason_ = "auto: 1 process and " + gpu_text;
    } else {
      strategy_ = Strategy::Single;
      reason_ = "auto: 1 process and " + gpu_text;
    }
  } else {
    reason_ = "asked; " + launched + ", " + gpu_text;
  }
  TANDEM_CHECK(processes == 1 || strategy_ == Strategy::Ddp, "Accelerator: strategy ", to_string(strategy_),
               " runs in one process, but ", launched, ": use Strategy::Ddp (or Auto), or start one process");
  TANDEM_CHECK(options_.zero_stage() == 0 || strategy_ != Strategy::DataParallel, "Accelerator: zero_stage ",
               options_.zero_stage(), " shards the optimizer across processes, and DataParallel runs in one: start "
               "one process per device (tandem run --nproc-per-node N) with Strategy::Ddp, or use zero_stage 0");
  device_ = gpus > 0 ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(
                                                   strategy_ == Strategy::DataParallel ? 0 : world_.local_rank))
                     : c10::Device(c10::kCPU);
}

void Accelerator::prepare_optimizer(torch::optim::Optimizer& optimizer) {
  TANDEM_CHECK(std::find(optimizers_.begin(), optimizers_.end(), &optimizer) == optimizers_.end(),
               "prepare_optimizer: this optimizer is prepared already");
  // One process has nothing to shard: the optimizer stays whole (whatever the strategy, so that
  // its checkpoints load under Single and Ddp alike).
  const bool shard = options_.zero_stage() >= 1 && pg_ && pg_->size() > 1 && strategy_ == Strategy::Ddp;
  auto sharded = shard ? std::make_unique<zero::ShardedOptimizer>(optimizer, pg_) : nullptr;  // may throw: nothing kept
  optimizers_.push_back(&optimizer);
  sharded_.push_back(std::move(sharded));
}

zero::ShardedOptimizer* Accelerator::sharded_of(const torch::optim::Optimizer& optimizer) const {
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    if (optimizers_[o] == &optimizer) return sharded_[o].get();
  }
  return nullptr;
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
  zero::ShardedOptimizer* sharded = sharded_of(optimizer);
  const bool stepped = sharded ? sharded->step(stepper) : stepper(optimizer);
  if (scaler_) {
    // One update per iteration, once every prepared optimizer has stepped.
    bool all_stepped = true;
    for (auto* o : optimizers_) all_stepped = all_stepped && scaler_->state_of(*o) == amp::OptState::Stepped;
    if (all_stepped) scaler_->update();
  }
  step_skipped_ = !stepped;
  // One step per iteration, however many optimizers (the first prepared one counts).
  if (optimizers_.empty() || &optimizer == optimizers_.front()) ++completed_steps_;
  return stepped;
}

void Accelerator::zero_grad(torch::optim::Optimizer& optimizer) {
  if (!sync_gradients_) return;
  if (zero::ShardedOptimizer* sharded = sharded_of(optimizer)) {
    sharded->zero_grad();  // every parameter's, not only the ones this process owns
  } else {
    optimizer.zero_grad();
  }
}

double Accelerator::clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  if (!sync_gradients_) return 0.0;
  // Unscale once, here; step() sees the optimizer already unscaled (accelerate#641 unscaled twice).
  if (scaler_) {
    for (auto* optimizer : optimizers_) {
      if (scaler_->state_of(*optimizer) == amp::OptState::Ready) scaler_->unscale(*optimizer);
    }
  }
  std::vector<const zero::ShardedOptimizer*> sharded;
  for (const auto& s : sharded_) {
    if (s) sharded.push_back(s.get());
  }
  if (sharded.empty()) return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
  return zero::clip_grad_norm(parameters, sharded, *pg_, max_norm, norm_type);
}

// ---- utilities ------------------------------------------------------------------------------------

void Accelerator::wait_for_everyone() {
  if (pg_ && pg_->size() > 1) pg_->barrier();
}

at::Tensor Accelerator::gather(const at::Tensor& tensor) {
  if (!pg_ || pg_->size() == 1) return tensor;
  at::Tensor local = tensor.contiguous();
  const bool cpu_only = !pg_->has_nccl() && local.is_cuda();
  if (cpu_only) local = local.cpu();
  auto parts = pg_->all_gather(local);
  return at::cat(parts, 0).to(tensor.device());
}

at::Tensor Accelerator::reduce(const at::Tensor& tensor, comm::ReduceOp op) {
  at::Tensor result = tensor.clone();
  if (pg_ && pg_->size() > 1) pg_->all_reduce(result, op);
  return result;
}

// Rank r's i-th sample of batch b sits at position (b * batch + i) * W + r of the sampler's
// padded order; positions from the dataset size on are the repeated ones.
at::Tensor Accelerator::gather_for_metrics(const at::Tensor& tensor) {
  TANDEM_CHECK(tensor.dim() > 0, "gather_for_metrics: the tensor needs a batch dimension (dim 0)");
  at::Tensor all = gather(tensor);
  const int W = world_.world_size;
  if (W == 1 || !last_batch_) return all;
  const auto& p = *last_batch_;
  const int64_t rows = tensor.size(0);
  // [W, rows, ...] -> [rows, W, ...] -> [rows * W, ...]: the sampler's order.
  std::vector<int64_t> shape{W, rows};
  for (int64_t d = 1; d < tensor.dim(); ++d) shape.push_back(tensor.size(d));
  at::Tensor ordered = all.reshape(shape).transpose(0, 1).reshape(all.sizes());
  const int64_t first = p.batch_index * p.batch_size * W;
  const int64_t keep = std::max<int64_t>(0, std::min<int64_t>(rows * W, p.dataset_size - first));
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
  const int64_t W = world_.world_size, r = world_.rank;
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

// ---- checkpoints ------------------------------------------------------------------------------------

void Accelerator::register_for_checkpointing(const std::string& name, std::function<std::string()> save,
                                             std::function<void(const std::string&)> load) {
  TANDEM_CHECK(!name.empty() && name.find('/') == std::string::npos, "register_for_checkpointing: '", name,
               "' is not a valid name (non-empty, no '/')");
  custom_.emplace_back(name, std::move(save), std::move(load));
}

namespace {

// Every rank's generator states, gathered so that the main process writes them all.
std::vector<std::pair<std::string, at::Tensor>> rng_states(const std::shared_ptr<comm::ProcessGroup>& pg, int world,
                                                           const c10::Device& device) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::vector<std::pair<std::string, at::Tensor>> mine{
      {"cpu", at::detail::getDefaultCPUGenerator().get_state()}};
  if (device.is_cuda()) mine.emplace_back("cuda", at::globalContext().defaultGenerator(device).get_state());
  for (auto& [kind, state] : mine) {
    if (pg && world > 1) {
      auto all = pg->all_gather(state.contiguous());
      for (int r = 0; r < world; ++r) named.emplace_back(kind + "_rank_" + std::to_string(r), all[static_cast<size_t>(r)]);
    } else {
      named.emplace_back(kind + "_rank_0", state);
    }
  }
  return named;
}

}  // namespace

std::string Accelerator::save_state(const std::string& root) {
  // Accumulated gradients are not part of a checkpoint: a save between synchronisations would
  // resume differently, silently. (The condition is the same on every rank.)
  TANDEM_CHECK(sync_gradients_, "save_state: called in the middle of gradient accumulation (batch ",
               accumulation_step_ % options_.gradient_accumulation_steps(), " of ",
               options_.gradient_accumulation_steps(),
               "): the accumulated gradients are not saved; call it after a batch where sync_gradients() is true");
  const auto rng = rng_states(pg_, world_.world_size, device_);  // a collective: every rank
  // Note [ZeRO checkpoints, for now]: a sharded optimizer is saved as each process's shard (its
  // LibTorch archive), gathered to the main process and written beside the whole ones; it loads
  // back at the same world size, into an optimizer sharded the same way. Checkpoints that load at
  // any world size, sharded or not, are issue 21's next part.
  std::vector<std::vector<std::string>> shards(optimizers_.size());
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    if (sharded_[o]) shards[o] = gather_bytes(*pg_, optimizer_bytes(*optimizers_[o]));
  }
  std::string path = root + "/" + accelerate::checkpoint_name(completed_steps_);
  std::string failure;
  if (is_main_process()) {
    try {
      accelerate::CheckpointWriter writer(root, accelerate::checkpoint_name(completed_steps_));
      for (size_t m = 0; m < models_.size(); ++m) {
        accelerate::save_safetensors(writer.path_for("model_" + std::to_string(m) + ".safetensors"), models_[m].state(),
                                     {{"format", "pt"}});
      }
      nlohmann::json sharded_optimizers = nlohmann::json::array();
      for (size_t o = 0; o < optimizers_.size(); ++o) {
        sharded_optimizers.push_back(static_cast<bool>(sharded_[o]));
        if (sharded_[o]) {
          for (size_t r = 0; r < shards[o].size(); ++r) writer.add_file(shard_name(o, static_cast<int>(r)), shards[o][r]);
          continue;
        }
        torch::serialize::OutputArchive archive;
        optimizers_[o]->save(archive);
        archive.save_to(writer.path_for("optimizer_" + std::to_string(o) + ".pt"));
      }
      accelerate::save_safetensors(writer.path_for("rng.safetensors"), rng);
      nlohmann::json state;
      state["format"] = kStateFormat;
      state["world_size"] = world_.world_size;
      state["completed_steps"] = completed_steps_;
      state["accumulation_step"] = accumulation_step_;
      state["end_of_data"] = end_of_data_;
      state["models"] = models_.size();
      state["optimizers"] = optimizers_.size();
      state["sharded_optimizers"] = sharded_optimizers;
      state["loaders"] = nlohmann::json::array();
      for (const auto& loader : loaders_) {
        const auto [epoch, done] = loader.position();
        state["loaders"].push_back({{"epoch", epoch}, {"batches_done", done}});
      }
      if (scaler_) {
        const auto s = scaler_->state_dict();
        state["scaler"] = {{"scale", s.scale},
                           {"growth_factor", s.growth_factor},
                           {"backoff_factor", s.backoff_factor},
                           {"growth_interval", s.growth_interval},
                           {"_growth_tracker", s.growth_tracker}};
      }
      state["custom"] = nlohmann::json::array();
      for (const auto& [name, save, load] : custom_) {
        (void)load;
        writer.add_file("custom/" + name, save());
        state["custom"].push_back(name);
      }
      writer.add_file("state.json", state.dump(2));
      path = writer.commit();
      if (total_limit_ > 0) accelerate::keep_newest(root, total_limit_);
    } catch (const std::exception& e) {
      failure = one_line(e);
    }
  }
  // Every rank returns once the checkpoint exists (or every rank throws when it does not).
  if (pg_ && pg_->size() > 1) {
    at::Tensor failed = at::full({1}, failure.empty() ? 0 : 1, at::kInt);
    pg_->all_reduce(failed, comm::ReduceOp::Max);
    TANDEM_CHECK(failed.item<int>() == 0, failure.empty() ? "save_state: the main process failed to write " + path : failure);
  }
  TANDEM_CHECK(failure.empty(), "save_state: ", failure);
  return path;
}

void Accelerator::load_state(const std::string& path) {
  std::string dir = path;
  if (!exists(path + "/" + accelerate::kCheckpointManifest)) {
    const auto found = accelerate::list_checkpoints(path);
    TANDEM_CHECK(!found.empty(), "load_state: no checkpoint in ", path, " (expected a folder with ",
                 accelerate::kCheckpointManifest, ", or a folder of checkpoint_<step> folders)");
    dir = found.back();  // the newest, a path under `path`
  }
  accelerate::CheckpointReader reader(dir);  // verifies every file's size and CRC-32
  const auto state = nlohmann::json::parse(reader.read("state.json"));
  TANDEM_CHECK(state.value("format", 0) == kStateFormat, "load_state: ", dir, "/state.json has format ",
               state.value("format", 0), ", expected ", kStateFormat);
  const int saved_world = state.at("world_size").get<int>();
  TANDEM_CHECK(saved_world == world_.world_size, "load_state: ", dir, " was written by ", saved_world,
               " processes, this job has ", world_.world_size, ": exact resume needs the same world size");
  TANDEM_CHECK(state.at("models").get<size_t>() == models_.size() && state.at("optimizers").get<size_t>() == optimizers_.size(),
               "load_state: ", dir, " holds ", state.at("models").get<size_t>(), " model(s) and ",
               state.at("optimizers").get<size_t>(), " optimizer(s), this Accelerator prepared ", models_.size(), " and ",
               optimizers_.size());
  at::NoGradGuard no_grad;
  for (size_t m = 0; m < models_.size(); ++m) {
    const std::string file = "model_" + std::to_string(m) + ".safetensors";
    auto saved = accelerate::load_safetensors(reader.path(file));
    std::map<std::string, at::Tensor> by_name(saved.tensors.begin(), saved.tensors.end());
    for (auto& [name, tensor] : models_[m].state()) {
      auto it = by_name.find(name);
      TANDEM_CHECK(it != by_name.end(), "load_state: ", file, " has no tensor '", name, "'");
      TANDEM_CHECK(it->second.sizes() == tensor.sizes() && it->second.scalar_type() == tensor.scalar_type(),
                   "load_state: ", file, ": '", name, "' is ", c10::toString(it->second.scalar_type()), it->second.sizes(),
                   " but the model's is ", c10::toString(tensor.scalar_type()), tensor.sizes());
      tensor.copy_(it->second);
    }
  }
  const auto saved_sharded = state.value("sharded_optimizers", std::vector<bool>(optimizers_.size(), false));
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    const bool sharded = static_cast<bool>(sharded_[o]);
    TANDEM_CHECK(o < saved_sharded.size() && saved_sharded[o] == sharded, "load_state: ", dir, " holds optimizer ", o,
                 saved_sharded.size() > o && saved_sharded[o] ? " sharded (ZeRO)" : " whole", ", but this Accelerator's is ",
                 sharded ? "sharded (zero_stage 1)" : "whole", ": resume with the zero_stage it was saved with");
    torch::serialize::InputArchive archive;
    if (sharded) {
      std::istringstream in(reader.read(shard_name(o, world_.rank)));
      archive.load_from(in);
    } else {
      archive.load_from(reader.path("optimizer_" + std::to_string(o) + ".pt"));
    }
    optimizers_[o]->load(archive);
  }
  auto rng = accelerate::load_safetensors(reader.path("rng.safetensors"));
  for (const auto& [name, tensor] : rng.tensors) {
    if (name == "cpu_rank_" + std::to_string(world_.rank)) {
      at::Generator cpu = at::detail::getDefaultCPUGenerator();
      cpu.set_state(tensor);
    }
    if (name == "cuda_rank_" + std::to_string(world_.rank) && device_.is_cuda()) {
      at::Generator cuda = at::globalContext().defaultGenerator(device_);
      cuda.set_state(tensor);
    }
  }
  if (scaler_ && state.contains("scaler")) {
    amp::GradScalerState s;
    const auto& j = state["scaler"];
    s.scale = j.at("scale").get<double>();
    s.growth_factor = j.at("growth_factor").get<double>();
    s.backoff_factor = j.at("backoff_factor").get<double>();
    s.growth_interval = j.at("growth_interval").get<int64_t>();
    s.growth_tracker = j.at("_growth_tracker").get<int64_t>();
    scaler_->load_state_dict(s);
  }
  const auto& positions = state.at("loaders");
  TANDEM_CHECK(positions.size() == loaders_.size(), "load_state: ", dir, " holds the position of ", positions.size(),
               " loader(s), this Accelerator prepared ", loaders_.size());
  for (size_t l = 0; l < loaders_.size(); ++l) {
    loaders_[l].resume(positions[l].at("epoch").get<int64_t>(), positions[l].at("batches_done").get<int64_t>());
  }
  completed_steps_ = state.at("completed_steps").get<int64_t>();
  accumulation_step_ = state.at("accumulation_step").get<int64_t>();
  end_of_data_ = state.at("end_of_data").get<bool>();
  for (const auto& [name, save, load] : custom_) {
    (void)save;
    load(reader.read("custom/" + name));
  }
}

// Note [Auto-resume]
// A restarted job (`tandem run --max-restarts`, a preempted job submitted again) calls
// load_state_if_any(root) before its loop, as accelerate users call load_state on their newest
// folder. Only committed checkpoints are candidates (list_checkpoints): a writer killed in the
// middle of save_state leaves a hidden `.tmp-` folder, which is never listed, so the job resumes
// from the checkpoint before it. Every process lists `root` itself (a shared file system), so the
// processes first agree on what they saw: a process that resumed while another started afresh
// would train different weights without a word. After loading they agree again on success, so
// that a file damaged for one process stops every process at once instead of leaving the others
// blocked in their first collective until the collective timeout.
namespace {

constexpr int64_t kNoCheckpoint = -1, kCannotList = -2;

/// The step in a list_checkpoints path ("…/checkpoint_000120" -> 120), saturating, and a hash of
/// the name, so that two names with equal steps ("checkpoint_8", "checkpoint_008") differ.
std::pair<int64_t, int64_t> identify(const std::string& path) {
  const std::string name = path.substr(path.rfind('/') + 1);
  const std::string digits = name.substr(std::string(accelerate::kCheckpointPrefix).size());
  errno = 0;
  const long long step = std::strtoll(digits.c_str(), nullptr, 10);
  return {errno == ERANGE ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(step),
          static_cast<int64_t>(std::hash<std::string>{}(name) >> 1)};
}

std::string describe_seen(int64_t step) {
  if (step == kNoCheckpoint) return "none";
  if (step == kCannotList) return "cannot list it";
  return "checkpoint of step " + std::to_string(step);
}

}  // namespace

std::optional<std::string> Accelerator::load_state_if_any(const std::string& root) {
  std::optional<std::string> newest;
  std::string list_error;
  try {
    const auto found = accelerate::list_checkpoints(root);
    if (!found.empty()) newest = found.back();
  } catch (const std::exception& e) {
    list_error = one_line(e);
  }
  const bool distributed = pg_ && pg_->size() > 1;
  if (distributed) {
    const auto mine = !list_error.empty() ? std::make_pair(kCannotList, int64_t{0})
                      : newest            ? identify(*newest)
                                          : std::make_pair(kNoCheckpoint, int64_t{0});
    const auto all = pg_->all_gather(at::tensor({mine.first, mine.second}, at::kLong));
    bool same = true, unlistable = false;
    std::string seen;
    for (size_t r = 0; r < all.size(); ++r) {
      const int64_t step = all[r][0].item<int64_t>(), hash = all[r][1].item<int64_t>();
      same = same && step == mine.first && hash == mine.second;
      unlistable = unlistable || step == kCannotList;
      seen += message(r ? ", " : "", "rank ", r, " ", describe_seen(step));
    }
    TANDEM_CHECK(list_error.empty(), "load_state_if_any: ", list_error);
    TANDEM_CHECK(!unlistable, "load_state_if_any: ", root, ": another process cannot list it (", seen, ")");
    TANDEM_CHECK(same, "load_state_if_any: the processes see different checkpoints under ", root, " (", seen,
                 "): every process must see the same folder, e.g. on a shared file system");
  }
  TANDEM_CHECK(list_error.empty(), "load_state_if_any: ", list_error);
  if (!newest) return std::nullopt;
  std::string load_error;
  try {
    load_state(*newest);
  } catch (const std::exception& e) {
    load_error = one_line(e);
  }
  if (distributed) {
    const auto all = pg_->all_gather(at::full({1}, load_error.empty() ? 0 : 1, at::kInt));
    std::string failed;
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].item<int>() != 0) failed += message(failed.empty() ? "" : ", ", r);
    }
    TANDEM_CHECK(load_error.empty(), load_error);
    TANDEM_CHECK(failed.empty(), "load_state_if_any: rank(s) ", failed, " failed to load ", *newest,
                 " (their own error says why); this process loaded it but stops too");
  }
  TANDEM_CHECK(load_error.empty(), load_error);
  return newest;
}

}  // namespace tandem
