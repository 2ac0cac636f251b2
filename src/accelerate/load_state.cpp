// load_state (read and check everything, then apply: Note [Loading all or nothing]) and
// load_state_if_any (Note [Auto-resume]).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

#include "accelerate/optimizer_state.h"
#include "accelerate/sharded_tensors.h"
#include "accelerate/state_format.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/error.h"
#include "tandem/nn/region_rng.h"
#include "tandem/tp/random.h"
#include "tandem/zero/partitioned_optimizer.h"

namespace tandem {

using accelerate::kStateFormat;
using accelerate::names_for;

// Note [Resuming at another world size]
// A checkpoint holds nothing that depends on the world size it was written at:
// - the weights are by name, whole or as rows of any cut (Note [Sharded checkpoints]);
// - each optimizer's state is by parameter name (Note [Optimizer state by name]), whole or one
//   file per rank of a sharded optimizer; a loader keeps what it holds under its own sharding;
// - the loaders' positions count the samples of the epoch's order consumed (Note [Loader
//   position]), so the rest of the epoch is split among the new ranks, every sample once.
// What cannot carry over is each rank's random generator: at the same world size and tp_size
// every rank gets its own state back (the run continues exactly as if never stopped); at another
// one there is no "own" state, so every rank seeds its generators with reseed(seed, data-parallel
// rank, step) — reproducible (the same checkpoint at the same new shape draws the same numbers),
// the same within a tensor-parallel group, different across data-parallel ranks, and different
// from the seeds a fresh job starts with.
namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// splitmix64 over (seed, rank, step): Note [Resuming at another world size].
uint64_t reseed(uint64_t seed, int rank, int64_t step) {
  uint64_t x = seed;
  for (uint64_t v : {static_cast<uint64_t>(rank), static_cast<uint64_t>(step), uint64_t{0x7a6e}}) {
    x += 0x9e3779b97f4a7c15ULL + v;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
  }
  return x;
}

}  // namespace

// Note [Loading all or nothing]
// load_state first reads and checks everything the checkpoint holds (every file against the
// manifest, names, shapes, types, the optimizers' state, the positions), on every rank, and the
// ranks agree on the outcome before anything changes: a damaged or foreign file stops every rank
// with the model, the optimizers and the loop exactly as they were, never half-loaded.
struct Accelerator::StagedCheckpoint {
  std::string dir;
  nlohmann::json state;
  int saved_world = 0, saved_tp = 1, saved_pp = 1;
  bool same_shape = false;  // the same world, tp_size and pp_size: each rank's own generators come back
  std::vector<NamedTensors> weights;  // per model, this process's box of each tensor by name
  std::vector<accelerate::StagedOptimizerState> named;
  std::vector<std::string> archives;  // LibTorch archives (an optimizer without a named format)
  std::vector<zero::PartitionedOptimizer::BuiltState> flat;  // zero_stage 2's slices, FSDP's rows
  std::vector<std::pair<std::string, at::Tensor>> rng;  // this rank's generator states
  std::vector<std::string> custom;
  std::optional<amp::GradScalerState> scaler;
  std::vector<std::pair<int64_t, int64_t>> positions;  // (epoch, samples_done) per loader
  int64_t completed_steps = 0, accumulation_step = 0;
  bool end_of_data = false;
};

void Accelerator::load_state(const std::string& path) {
  StagedCheckpoint staged;
  std::string failure;
  try {  // no collective in here: a rank that failed is not waited for
    staged.dir = path;
    if (!exists(path + "/" + accelerate::kCheckpointManifest)) {
      const auto found = accelerate::list_checkpoints(path);
      TANDEM_CHECK(!found.empty(), "load_state: no checkpoint in ", path, " (expected a folder with ",
                   accelerate::kCheckpointManifest, ", or a folder of checkpoint_<step> folders)");
      staged.dir = found.back();  // the newest, a path under `path`
    }
    const accelerate::CheckpointReader reader(staged.dir);  // verifies every file's size and CRC-32
    stage_shape(reader, staged);
    stage_models(reader, staged);
    stage_optimizers(reader, staged);
    stage_progress(reader, staged);
  } catch (const std::exception& e) {
    failure = one_line(e);
  }
  if (pg_ && pg_->size() > 1) {
    at::Tensor failed = at::full({1}, failure.empty() ? 0 : 1, at::kInt);
    pg_->all_reduce(failed, comm::ReduceOp::Max);
    TANDEM_CHECK(failure.empty(), failure);
    TANDEM_CHECK(failed.item<int>() == 0, "load_state: another process could not read ", staged.dir,
                 " (its error says why); nothing was loaded");
  }
  TANDEM_CHECK(failure.empty(), failure);
  apply(staged);  // everything is read and checked on every rank
}

void Accelerator::stage_shape(const accelerate::CheckpointReader& reader, StagedCheckpoint& staged) const {
  auto& state = staged.state;
  state = nlohmann::json::parse(reader.read("state.json"));
  const int format = state.value("format", 0);
  TANDEM_CHECK(format == kStateFormat, "load_state: ", staged.dir, "/state.json has format ", format, ", expected ",
               kStateFormat, format == 1 ? " (written by an older Tandem: resume it with the version that wrote it)" : "");
  staged.saved_world = state.at("world_size").get<int>();
  staged.saved_tp = state.value("tp_size", 1);
  staged.saved_pp = state.value("pp_size", 1);
  staged.same_shape =
      staged.saved_world == world_.world_size && staged.saved_tp == plan_.tp && staged.saved_pp == plan_.pp;
  const size_t models = checkpoint_models().size();  // a pipeline's stages count as one
  const auto& optimizers = state.at("optimizers");
  TANDEM_CHECK(state.at("models").get<size_t>() == models && optimizers.size() == optimizers_.size(), "load_state: ",
               staged.dir, " holds ", state.at("models").get<size_t>(), " model(s) and ", optimizers.size(),
               " optimizer(s), this Accelerator prepared ", models, " and ", optimizers_.size());
}

// Each tensor's box, as its layout places it here, from whichever files hold it.
void Accelerator::stage_models(const accelerate::CheckpointReader& reader, StagedCheckpoint& staged) const {
  const auto loaded_models = checkpoint_models();
  staged.weights.resize(models_.size());
  for (size_t m = 0; m < loaded_models.size(); ++m) {
    const auto files = accelerate::model_files(staged.state, m);
    std::vector<std::string> paths;
    for (const auto& f : files) paths.push_back(reader.path(f));
    const std::string file = files.size() == 1 ? files[0] : message("model_", m, ".rank*.safetensors");
    const accelerate::ShardedTensors saved(paths, message("load_state: ", staged.dir));
    for (size_t member : loaded_models[m]) {
      for (const auto& slot : models_[member].layout()) {
        TANDEM_CHECK(saved.contains(slot.name), "load_state: ", file, " has no tensor '", slot.name, "'");
        const comm::Layout& l = slot.layout;
        TANDEM_CHECK(saved.shape(slot.name) == l.shape && saved.dtype(slot.name) == slot.dtype, "load_state: ", file,
                     ": '", slot.name, "' is ", c10::toString(saved.dtype(slot.name)),
                     c10::IntArrayRef(saved.shape(slot.name)), " but the model's is ", c10::toString(slot.dtype),
                     c10::IntArrayRef(l.shape));
        staged.weights[member].emplace_back(
            slot.name, l.whole() ? saved.whole(slot.name) : saved.chunk(slot.name, l.chunk.offsets, l.chunk.sizes));
      }
    }
  }
}

// Each parameter's state, the box of it this process keeps (as its parameter lies, or FSDP's rows
// of it), by name from whichever files hold it; a partitioned optimizer's pieces built from it.
void Accelerator::stage_optimizers(const accelerate::CheckpointReader& reader, StagedCheckpoint& staged) {
  const auto identities = model_identities();
  staged.named.resize(optimizers_.size());
  staged.archives.resize(optimizers_.size());
  staged.flat.resize(optimizers_.size());
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    const auto& entry = staged.state.at("optimizers")[o];
    const std::string where = message("load_state: ", staged.dir, ": optimizer ", o);
    const bool saved_sharded = entry.at("sharded").get<bool>();
    const auto files = entry.at("files").get<std::vector<std::string>>();
    if (entry.at("type").get<std::string>().empty()) {  // a LibTorch archive: it loads only where it was written
      const bool sharded = state_per_rank(o);
      TANDEM_CHECK(saved_sharded == sharded && staged.same_shape && !files.empty(), where,
                   " is an optimizer of its own type saved as LibTorch archive(s) by ", staged.saved_world,
                   " process(es) at tp_size ", staged.saved_tp, ", ", saved_sharded ? "sharded" : "whole",
                   "; it loads only like that (this job: ", world_.world_size, " at tp_size ", plan_.tp, ", ",
                   sharded ? "sharded" : "whole",
                   "). SGD, Adam, AdamW, RMSprop and Adagrad load at any world size, tp_size and sharding");
      staged.archives[o] = reader.read(files.at(saved_sharded ? static_cast<size_t>(world_.rank) : 0));
      continue;
    }
    std::vector<std::string> paths;
    for (const auto& f : files) paths.push_back(reader.path(f));
    const auto groups = optimizer_groups(o);
    zero::PartitionedOptimizer* pieces = optimizers_[o]->partitioned();
    const bool by_rows = optimizers_[o]->state_layout() == zero::DistributedOptimizer::StateLayout::ByRows;
    auto held_piece = [&](const at::Tensor& p) {
      if (!by_rows) {
        const comm::Layout l = layout_of(p, p.sizes().vec(), tp_cut_of(p), std::nullopt);
        return accelerate::HeldPiece{l.shape, p.options(), l.whole() ? std::vector<int64_t>{} : l.chunk.offsets,
                                     l.chunk.sizes};
      }
      const auto held = pieces->held_rows(p);
      const comm::Layout l = layout_of(p, held.shape, tp_cut_of(p), std::make_pair(held.first_row, held.count));
      return accelerate::HeldPiece{l.shape, held.options, l.chunk.offsets, l.chunk.sizes};
    };
    staged.named[o] = accelerate::stage_optimizer_state(optimizers_[o]->optimizer(), groups,
                                                        names_for(identities, groups), held_parameters(o), entry,
                                                        paths, where, held_piece,
                                                        staged.state.value("pipeline", false) || has_pipeline());
    if (!pieces) continue;
    // ZeRO-2 and FSDP: this rank's pieces, built from the staged state now (checked).
    std::unordered_map<const void*, const torch::optim::OptimizerParamState*> by_param;
    for (const auto& [param, st] : staged.named[o].states) by_param[param.unsafeGetTensorImpl()] = st.get();
    try {
      staged.flat[o] = pieces->build_state([&](const at::Tensor& p) -> const torch::optim::OptimizerParamState* {
        auto it = by_param.find(p.unsafeGetTensorImpl());
        return it == by_param.end() ? nullptr : it->second;
      });
    } catch (const std::exception& e) {
      throw Error(message(where, ": ", one_line(e)));
    }
  }
}

// The loop's position: generators, loaders, steps, the scaler, what the caller registered.
void Accelerator::stage_progress(const accelerate::CheckpointReader& reader, StagedCheckpoint& staged) const {
  const auto& state = staged.state;
  if (staged.same_shape) {
    auto rng = accelerate::load_safetensors(reader.path("rng.safetensors"));
    const std::string suffix = "_rank_" + std::to_string(world_.rank);
    for (auto& [name, tensor] : rng.tensors) {
      const std::string kind = name.substr(0, name.find('_'));
      const bool cuda = kind == "cuda" || kind == "region-cuda";
      if (name == kind + suffix && (!cuda || device_.is_cuda())) staged.rng.emplace_back(kind, tensor);
    }
  }
  const auto& positions = state.at("loaders");
  TANDEM_CHECK(positions.size() == loaders_.size(), "load_state: ", staged.dir, " holds the position of ",
               positions.size(), " loader(s), this Accelerator prepared ", loaders_.size());
  for (size_t l = 0; l < loaders_.size(); ++l) {
    const auto epoch = positions[l].at("epoch").get<int64_t>();
    const auto done = positions[l].at("samples_done").get<int64_t>();
    TANDEM_CHECK(epoch >= 0 && done >= 0 && done <= loaders_[l].dataset_size, "load_state: ", staged.dir,
                 ": loader ", l, " stopped at sample ", done, " of epoch ", epoch, ", outside its ",
                 loaders_[l].dataset_size, " samples: the checkpoint belongs to other data");
    staged.positions.emplace_back(epoch, done);
  }
  staged.completed_steps = state.at("completed_steps").get<int64_t>();
  staged.accumulation_step = state.at("accumulation_step").get<int64_t>();
  staged.end_of_data = state.at("end_of_data").get<bool>();
  if (scaler_ && state.contains("scaler")) {
    amp::GradScalerState s;
    const auto& j = state["scaler"];
    s.scale = j.at("scale").get<double>();
    s.growth_factor = j.at("growth_factor").get<double>();
    s.backoff_factor = j.at("backoff_factor").get<double>();
    s.growth_interval = j.at("growth_interval").get<int64_t>();
    s.growth_tracker = j.at("_growth_tracker").get<int64_t>();
    staged.scaler = s;
  }
  for (const auto& [name, save, load] : custom_) {
    (void)save, (void)load;
    staged.custom.push_back(reader.read("custom/" + name));
  }
}

void Accelerator::apply(StagedCheckpoint& staged) {
  for (size_t m = 0; m < models_.size(); ++m) models_[m].load(staged.weights[m]);
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    torch::optim::Optimizer& optimizer = optimizers_[o]->optimizer();
    if (zero::PartitionedOptimizer* pieces = optimizers_[o]->partitioned()) {
      accelerate::apply_optimizer_options(optimizer, staged.named[o].options);
      pieces->install_state(std::move(staged.flat[o]));
    } else if (staged.archives[o].empty()) {
      accelerate::apply_optimizer_state(optimizer, held_parameters(o), std::move(staged.named[o]));
    } else {
      torch::serialize::InputArchive archive;
      std::istringstream in(staged.archives[o]);
      archive.load_from(in);
      optimizer.load(archive);
    }
  }
  if (staged.same_shape) {
    auto region = nn::region_rng_states();  // a save without them leaves them as seeded
    for (const auto& [kind, tensor] : staged.rng) {
      if (kind == "region-cpu" || kind == "region-cuda") {
        const c10::Device where = kind == "region-cpu" ? c10::Device(c10::kCPU) : device_;
        for (auto& [device, state] : region) {
          if (device == where) state = tensor;
        }
        continue;
      }
      at::Generator generator =
          kind == "cpu" ? at::detail::getDefaultCPUGenerator() : at::globalContext().defaultGenerator(device_);
      generator.set_state(tensor);
    }
    nn::set_region_rng_states(region);
  } else {
    // Note [Resuming at another world size]; at another tp_size too, as each tensor-parallel
    // group must draw alike (the generators are seeded by data-parallel rank).
    tp::manual_seed(reseed(options_.seed(), data_parallel_rank(), staged.completed_steps), parallel_ranks());
  }
  if (staged.scaler) scaler_->load_state_dict(*staged.scaler);
  for (size_t l = 0; l < loaders_.size(); ++l) loaders_[l].resume(staged.positions[l].first, staged.positions[l].second);
  completed_steps_ = staged.completed_steps;
  accumulation_step_ = staged.accumulation_step;
  end_of_data_ = staged.end_of_data;
  for (size_t c = 0; c < custom_.size(); ++c) std::get<2>(custom_[c])(staged.custom[c]);
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
