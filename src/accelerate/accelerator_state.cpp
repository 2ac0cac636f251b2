// The Accelerator's checkpoints: save_state, load_state, load_state_if_any (docs/checkpoints.md;
// the files themselves: checkpoint_dir.h, safetensors.h; the optimizers' state: optimizer_state.h).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include "accelerate/optimizer_state.h"
#include "accelerate/send_to_main.h"
#include "accelerate/sharded_tensors.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/error.h"
#include "tandem/nn/region_rng.h"
#include "tandem/tp/random.h"
#include "tandem/zero/partitioned_optimizer.h"

namespace tandem {

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

constexpr int kStateFormat = 2;

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

std::string model_file(size_t model, int rank, bool sharded) {
  return "model_" + std::to_string(model) + (sharded ? ".rank" + std::to_string(rank) : "") + ".safetensors";
}

std::string optimizer_file(size_t optimizer, int rank, bool sharded, bool named) {
  return "optimizer_" + std::to_string(optimizer) + (sharded ? ".rank" + std::to_string(rank) : "") +
         (named ? ".safetensors" : ".pt");
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& groups) {
  std::vector<at::Tensor> out;
  for (const auto& g : groups) out.insert(out.end(), g.begin(), g.end());
  return out;
}

// Each parameter's name: its name in the prepared model ("model_<m>/" before it from the second
// model on); one that belongs to no prepared model is named by position ("param_groups.<g>.<i>").
accelerate::ParamNames names_for(const std::vector<std::vector<std::pair<std::string, at::Tensor>>>& models,
                                 const std::vector<std::vector<at::Tensor>>& groups) {
  accelerate::ParamNames names;
  for (size_t m = 0; m < models.size(); ++m) {
    const std::string prefix = m == 0 ? "" : "model_" + std::to_string(m) + "/";
    for (const auto& [name, tensor] : models[m]) names.emplace(tensor.unsafeGetTensorImpl(), prefix + name);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].size(); ++i) {
      names.emplace(groups[g][i].unsafeGetTensorImpl(), message("param_groups.", g, ".", i));
    }
  }
  return names;
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

// Every rank's generator states, gathered so that the main process writes them all.
std::vector<std::pair<std::string, at::Tensor>> rng_states(const std::shared_ptr<comm::ProcessGroup>& pg, int world,
                                                           const c10::Device& device) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::vector<std::pair<std::string, at::Tensor>> mine{
      {"cpu", at::detail::getDefaultCPUGenerator().get_state()}};
  if (device.is_cuda()) mine.emplace_back("cuda", at::globalContext().defaultGenerator(device).get_state());
  for (const auto& [where, state] : nn::region_rng_states()) {  // seeded on every rank by the Accelerator
    if (where.is_cpu() || where == device) mine.emplace_back(where.is_cpu() ? "region-cpu" : "region-cuda", state);
  }
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

void Accelerator::register_for_checkpointing(const std::string& name, std::function<std::string()> save,
                                             std::function<void(const std::string&)> load) {
  TANDEM_CHECK(!name.empty() && name.find('/') == std::string::npos, "register_for_checkpointing: '", name,
               "' is not a valid name (non-empty, no '/')");
  custom_.emplace_back(name, std::move(save), std::move(load));
}

// Note [Pipeline checkpoints]
// A pipeline's stages are one model in a checkpoint: every process writes the tensors of its
// stages (the first data-parallel copy of each: whole, or FSDP's rows) into its own file, under
// the stages' own names, and a loader reads each tensor it holds, by name, from whichever file has
// it. So the stage modules' names must be the whole model's ("blocks.3.fc1.weight" on whichever
// stage holds block 3): then a checkpoint saved at one pipeline size loads at another, and into
// the whole model prepared without a pipeline, and the reverse. Two stages naming a tensor alike
// make pieces that overlap, which the loader refuses. Optimizers keep their state by parameter
// name (Note [Optimizer state by name]); under a pipeline every process writes its parameters'.
bool Accelerator::has_pipeline() const {
  return std::any_of(models_.begin(), models_.end(), [](const ModelEntry& m) { return m.stage; });
}

std::vector<std::vector<size_t>> Accelerator::checkpoint_models() const {
  std::vector<std::vector<size_t>> out;
  std::vector<size_t> stages;
  for (size_t m = 0; m < models_.size(); ++m) {
    if (models_[m].stage) {
      stages.push_back(m);
    } else {
      out.push_back({m});
    }
  }
  TANDEM_CHECK(stages.empty() || out.empty(), "checkpoints: a pipeline's stages and models prepared apart in one "
               "checkpoint are not built yet; prepare every model as a stage of the pipeline");
  if (!stages.empty()) out.push_back(stages);
  return out;
}

std::vector<Accelerator::NamedTensors> Accelerator::model_identities() const {
  std::vector<NamedTensors> out;
  for (const auto& m : models_) out.push_back(m.identities());
  return out;
}

std::vector<std::vector<at::Tensor>> Accelerator::optimizer_groups(size_t o) const {
  return optimizers_[o]->all_params();
}

std::vector<at::Tensor> Accelerator::held_parameters(size_t o) const {
  std::vector<at::Tensor> held;
  const auto& prepared = *optimizers_[o];
  const bool by_parameter = prepared.state_layout() == zero::DistributedOptimizer::StateLayout::ByParameter;
  for (const auto& p : flatten(optimizer_groups(o))) {
    if (!by_parameter || prepared.owner_of(p) == data_parallel_group()->rank()) held.push_back(p);
  }
  return held;
}

// Note [Sharded checkpoints]
// Under FSDP no process holds a whole model, and a checkpoint must not make one: every rank
// writes its shards' rows of the weights (model_<m>.rank<r>.safetensors) and of the optimizer's
// state (optimizer_<o>.rank<r>.safetensors), Note [Sharded files]; a loader at any world
// size and under any strategy reads the rows it needs from whichever files hold them. The files
// travel to the main process one rank at a time (send_to_main), so saving needs no shared file
// system and the main process never holds more than two ranks' shards. Whole models (DDP, ZeRO,
// one process) keep one model_<m>.safetensors, written by the main process. Under HSDP the
// replicas hold the same rows: only the first replica's processes write theirs (writes_rows()),
// the others' files hold none, so the pieces still tile every tensor once.
// Note [Checkpoints under tensor parallelism]
// Tensor parallelism cuts a parameter into even parts along one dimension (Shard(d)); FSDP then
// holds rows of this rank's part. Either way a rank holds one box of the whole tensor
// (its Layout, Note [Layouts] in accelerator.cpp: the part's offset along d, plus FSDP's first row along dim 0), and a checkpoint
// writes it as such, with the whole shape (Note [Sharded files]): the same files as FSDP's rows,
// any box in them. Of the copies of one box only the first is written (Layout::counts): the first
// data-parallel rank's (under HSDP the first replica's), and of a parameter the plan did not cut,
// the first tensor-parallel rank's. A whole optimizer (DDP's) holds its cut parameters' state as
// the same boxes, so under tensor parallelism it too writes one file per rank. A loader reads its
// own box of each tensor, whatever cut, mesh or strategy wrote them: a job at tp_size 2 resumes at
// tp_size 1 or 4, under DDP or FSDP, and the other way round.
std::string Accelerator::save_state(const std::string& root) {
  // Accumulated gradients are not part of a checkpoint: a save between synchronisations would
  // resume differently, silently. (The condition is the same on every rank.)
  TANDEM_CHECK(sync_gradients_, "save_state: called in the middle of gradient accumulation (batch ",
               accumulation_step_ % options_.gradient_accumulation_steps(), " of ",
               options_.gradient_accumulation_steps(),
               "): the accumulated gradients are not saved; call it after a batch where sync_gradients() is true");
  const bool main = is_main_process();
  const std::string name = accelerate::checkpoint_name(completed_steps_);
  std::string path = root + "/" + name;
  std::string failure;
  std::optional<accelerate::CheckpointWriter> writer;
  auto attempt = [&](const std::function<void()>& write) {  // the main process's writing; the first failure stops it
    if (!main || !failure.empty()) return;
    try {
      write();
    } catch (const std::exception& e) {
      failure = one_line(e);
    }
  };
  attempt([&] { writer.emplace(root, name); });
  const auto rng = rng_states(pg_, world_.world_size, device_);  // a collective: every rank
  const int world = world_.world_size;

  // The weights: whole (the main process's), or every rank's pieces (collective): its rows, its
  // tensor-parallel box, its pipeline stages' tensors (Note [Pipeline checkpoints]).
  const auto saved_models = checkpoint_models();
  const bool pipeline = has_pipeline();
  nlohmann::json model_files = nlohmann::json::array();
  for (size_t m = 0; m < saved_models.size(); ++m) {
    std::vector<ModelSlot> layout;
    NamedTensors held;
    for (size_t member : saved_models[m]) {
      for (auto& slot : models_[member].layout()) layout.push_back(std::move(slot));
      for (auto& item : models_[member].held()) held.push_back(std::move(item));
    }
    const bool sharded =
        pipeline || std::any_of(layout.begin(), layout.end(), [](const ModelSlot& s) { return !s.layout.whole(); });
    model_files.push_back(nlohmann::json::array());
    if (!sharded) {
      const auto file = model_file(m, 0, false);
      attempt([&] { accelerate::save_safetensors(writer->path_for(file), held, {{"format", "pt"}}); });
      model_files.back().push_back(file);
      continue;
    }
    auto build = [&] {
      std::vector<accelerate::ChunkPiece> pieces;
      for (size_t i = 0; i < layout.size(); ++i) {
        const comm::Layout& l = layout[i].layout;
        if (l.counts()) pieces.push_back({layout[i].name, held[i].second, l.chunk.offsets, l.shape});
      }
      return accelerate::chunk_pieces_bytes(pieces);
    };
    accelerate::send_to_main(pg_, "save_state", build, [&](int r, std::string bytes) {
      attempt([&] { writer->add_file(model_file(m, r, true), bytes); });
    });
    for (int r = 0; r < world; ++r) model_files.back().push_back(model_file(m, r, true));
  }

  // The optimizers: whole (the main process's), sharded by parameter (ZeRO-1), flat slices
  // gathered whole (ZeRO-2), or every rank's rows (FSDP). Note [Optimizer state by name].
  const auto identities = model_identities();
  nlohmann::json optimizer_state = nlohmann::json::array();
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    auto& optimizer = optimizers_[o]->optimizer();
    zero::PartitionedOptimizer* pieces = optimizers_[o]->partitioned();
    const auto layout = optimizers_[o]->state_layout();
    const auto groups = optimizer_groups(o);
    const auto names = names_for(identities, groups);
    const bool named = !accelerate::named_optimizer_type(optimizer).empty();
    nlohmann::json entry = named ? accelerate::describe_optimizer(optimizer, groups, names) : nlohmann::json{{"type", ""}};
    if (pipeline && named) {
      // Each process's groups hold its stages' parameters: the checkpoint's hold every stage's
      // (in rank order, each name once). Collective.
      std::vector<nlohmann::json> described;
      accelerate::send_to_main(pg_, "save_state", [&] { return entry.dump(); },
                   [&](int, std::string bytes) { described.push_back(nlohmann::json::parse(bytes)); });
      if (main) {
        for (size_t g = 0; g < entry["param_groups"].size(); ++g) {
          std::vector<std::string> merged;
          std::set<std::string> seen;
          for (const auto& d : described) {
            for (const auto& n : d["param_groups"][g]["params"]) {
              if (seen.insert(n.get<std::string>()).second) merged.push_back(n.get<std::string>());
            }
          }
          entry["param_groups"][g]["params"] = merged;
        }
      }
    }
    const bool rows = layout == zero::DistributedOptimizer::StateLayout::ByRows;
    // Under tensor parallelism a whole optimizer holds pieces of the cut parameters' state, under
    // a pipeline its stages' parameters': one file per rank as well (Note [Checkpoints under
    // tensor parallelism], Note [Pipeline checkpoints]).
    const bool whole_in_pieces = layout == zero::DistributedOptimizer::StateLayout::Whole && (plan_.tp > 1 || pipeline);
    const bool sharded = layout != zero::DistributedOptimizer::StateLayout::Whole || whole_in_pieces;
    entry["sharded"] = sharded;
    entry["files"] = nlohmann::json::array();
    if (sharded) {
      auto build = [&]() -> std::string {
        if (whole_in_pieces && named) {
          std::vector<accelerate::ChunkPiece> tp_pieces;
          for (const auto& p : held_parameters(o)) {
            const comm::Layout l = layout_of(p, p.sizes().vec(), tp_cut_of(p), std::nullopt);
            const std::string prefix = names.at(p.unsafeGetTensorImpl()) + ".";
            for (auto& [name, t] : accelerate::named_state(optimizer, {p}, names)) {
              if (name == prefix + "step") {  // the same on every copy: the main process's, or its stage's
                if (writes_shared_value()) tp_pieces.push_back({name, t, {}, t.sizes().vec()});
              } else if (l.counts()) {
                tp_pieces.push_back({name, t, l.chunk.offsets, l.shape});
              }
            }
          }
          return accelerate::chunk_pieces_bytes(tp_pieces);
        }
        if (!rows) {
          return named ? accelerate::safetensors_bytes(accelerate::named_state(optimizer, held_parameters(o), names),
                                                       {{"format", "pt"}})
                       : optimizer_bytes(optimizer);
        }
        std::vector<accelerate::ChunkPiece> row_pieces;
        for (auto& owned : pieces->owned_state()) {
          const std::string name = names.at(owned.param.unsafeGetTensorImpl()) + "." + owned.key;
          if (owned.key == "step") {  // the same on every copy: the main process's, or its stage's
            if (writes_shared_value()) row_pieces.push_back({name, owned.rows, {}, owned.rows.sizes().vec()});
            continue;
          }
          const comm::Layout l = layout_of(owned.param, owned.whole_shape, tp_cut_of(owned.param),
                                           std::make_pair(owned.first_row, owned.rows.size(0)));
          if (l.counts()) row_pieces.push_back({name, owned.rows, l.chunk.offsets, l.shape});
        }
        return accelerate::chunk_pieces_bytes(row_pieces);
      };
      accelerate::send_to_main(pg_, "save_state", build, [&](int r, std::string bytes) {
        attempt([&] { writer->add_file(optimizer_file(o, r, true, named), bytes); });
      });
      for (int r = 0; r < world; ++r) entry["files"].push_back(optimizer_file(o, r, true, named));
    } else {
      const auto file = optimizer_file(o, 0, false, named);
      entry["files"].push_back(file);
      if (pieces) {
        // Stage 2's flat slices: gathered into whole tensors (collective), written as a whole optimizer.
        std::vector<std::pair<std::string, at::Tensor>> whole;
        for (auto& [param, state] : pieces->gather_state()) {
          for (auto& [key, t] : state) whole.emplace_back(names.at(param.unsafeGetTensorImpl()) + "." + key, t);
        }
        attempt([&] { accelerate::save_safetensors(writer->path_for(file), whole, {{"format", "pt"}}); });
      } else if (named) {
        attempt([&] {
          accelerate::save_safetensors(writer->path_for(file), accelerate::named_state(optimizer, held_parameters(o), names),
                                       {{"format", "pt"}});
        });
      } else {
        attempt([&] {
          torch::serialize::OutputArchive archive;
          optimizer.save(archive);
          archive.save_to(writer->path_for(file));
        });
      }
    }
    optimizer_state.push_back(entry);
  }

  attempt([&] {
    accelerate::save_safetensors(writer->path_for("rng.safetensors"), rng);
    nlohmann::json state;
    state["format"] = kStateFormat;
    state["world_size"] = world_.world_size;
    state["tp_size"] = plan_.tp;
    state["pp_size"] = plan_.pp;
    state["completed_steps"] = completed_steps_;
    state["accumulation_step"] = accumulation_step_;
    state["end_of_data"] = end_of_data_;
    state["models"] = saved_models.size();
    state["pipeline"] = pipeline;
    state["model_files"] = model_files;
    state["optimizers"] = optimizer_state;
    state["loaders"] = nlohmann::json::array();
    for (const auto& loader : loaders_) {
      const auto [epoch, done] = loader.position();
      state["loaders"].push_back({{"epoch", epoch}, {"samples_done", done}});
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
    for (const auto& [custom_name, save, load] : custom_) {
      (void)load;
      writer->add_file("custom/" + custom_name, save());
      state["custom"].push_back(custom_name);
    }
    writer->add_file("state.json", state.dump(2));
    path = writer->commit();
    if (total_limit_ > 0) accelerate::keep_newest(root, total_limit_);
  });
  writer.reset();  // an uncommitted writer removes its folder
  // Every rank returns once the checkpoint exists (or every rank throws when it does not).
  if (pg_ && pg_->size() > 1) {
    at::Tensor failed = at::full({1}, failure.empty() ? 0 : 1, at::kInt);
    pg_->all_reduce(failed, comm::ReduceOp::Max);
    TANDEM_CHECK(failed.item<int>() == 0, failure.empty() ? "save_state: the main process failed to write " + path : failure);
  }
  TANDEM_CHECK(failure.empty(), "save_state: ", failure);
  return path;
}

// Note [Loading all or nothing]
// load_state first reads and checks everything the checkpoint holds (every file against the
// manifest, names, shapes, types, the optimizers' state, the positions), on every rank, and the
// ranks agree on the outcome before anything changes: a damaged or foreign file stops every rank
// with the model, the optimizers and the loop exactly as they were, never half-loaded.
void Accelerator::load_state(const std::string& path) {
  std::string dir = path;
  struct Staged {
    nlohmann::json state;
    int saved_world = 0, saved_tp = 1, saved_pp = 1;
    bool same_shape = false;  // the same world, tp_size and pp_size: each rank's own generators come back
    std::vector<NamedTensors> weights;  // per model, the saved tensors by name
    std::vector<accelerate::StagedOptimizerState> named;
    std::vector<std::string> archives;  // LibTorch archives (an optimizer without a named format)
    std::vector<std::pair<std::string, at::Tensor>> rng;  // this rank's generator states
    std::vector<std::string> custom;
    std::vector<zero::PartitionedOptimizer::BuiltState> flat;  // zero_stage 2's slices, FSDP's rows
    std::optional<amp::GradScalerState> scaler;
    std::vector<std::pair<int64_t, int64_t>> positions;  // (epoch, samples_done) per loader
    int64_t completed_steps = 0, accumulation_step = 0;
    bool end_of_data = false;
  } staged;
  std::string failure;
  try {
    if (!exists(path + "/" + accelerate::kCheckpointManifest)) {
      const auto found = accelerate::list_checkpoints(path);
      TANDEM_CHECK(!found.empty(), "load_state: no checkpoint in ", path, " (expected a folder with ",
                   accelerate::kCheckpointManifest, ", or a folder of checkpoint_<step> folders)");
      dir = found.back();  // the newest, a path under `path`
    }
    accelerate::CheckpointReader reader(dir);  // verifies every file's size and CRC-32
    auto& state = staged.state;
    state = nlohmann::json::parse(reader.read("state.json"));
    const int format = state.value("format", 0);
    TANDEM_CHECK(format == kStateFormat, "load_state: ", dir, "/state.json has format ", format, ", expected ",
                 kStateFormat, format == 1 ? " (written by an older Tandem: resume it with the version that wrote it)" : "");
    staged.saved_world = state.at("world_size").get<int>();
    staged.saved_tp = state.value("tp_size", 1);
    staged.saved_pp = state.value("pp_size", 1);
    staged.same_shape =
        staged.saved_world == world_.world_size && staged.saved_tp == plan_.tp && staged.saved_pp == plan_.pp;
    const auto& optimizers = state.at("optimizers");
    const auto loaded_models = checkpoint_models();  // a pipeline's stages count as one
    TANDEM_CHECK(state.at("models").get<size_t>() == loaded_models.size() && optimizers.size() == optimizers_.size(),
                 "load_state: ", dir, " holds ", state.at("models").get<size_t>(), " model(s) and ", optimizers.size(),
                 " optimizer(s), this Accelerator prepared ", loaded_models.size(), " and ", optimizers_.size());
    // Each slot's tensor, or this rank's rows of it, from whichever files hold them (no collective
    // here: a rank that failed above is not waited for).
    const auto identities = model_identities();
    staged.weights.resize(models_.size());
    for (size_t m = 0; m < loaded_models.size(); ++m) {
      const auto files = accelerate::model_files(state, m);
      std::vector<std::string> paths;
      for (const auto& f : files) paths.push_back(reader.path(f));
      const std::string file = files.size() == 1 ? files[0] : message("model_", m, ".rank*.safetensors");
      const accelerate::ShardedTensors saved(paths, message("load_state: ", dir));
      for (size_t member : loaded_models[m]) {
        for (const auto& slot : models_[member].layout()) {
          TANDEM_CHECK(saved.contains(slot.name), "load_state: ", file, " has no tensor '", slot.name, "'");
          const comm::Layout& l = slot.layout;
          TANDEM_CHECK(saved.shape(slot.name) == l.shape && saved.dtype(slot.name) == slot.dtype, "load_state: ",
                       file, ": '", slot.name, "' is ", c10::toString(saved.dtype(slot.name)),
                       c10::IntArrayRef(saved.shape(slot.name)), " but the model's is ", c10::toString(slot.dtype),
                       c10::IntArrayRef(l.shape));
          staged.weights[member].emplace_back(
              slot.name, l.whole() ? saved.whole(slot.name) : saved.chunk(slot.name, l.chunk.offsets, l.chunk.sizes));
        }
      }
    }
    staged.named.resize(optimizers_.size());
    staged.archives.resize(optimizers_.size());
    for (size_t o = 0; o < optimizers_.size(); ++o) {
      const auto& entry = optimizers[o];
      const std::string where = message("load_state: ", dir, ": optimizer ", o);
      const bool saved_sharded = entry.at("sharded").get<bool>();
      const auto files = entry.at("files").get<std::vector<std::string>>();
      if (entry.at("type").get<std::string>().empty()) {
        // A LibTorch archive: it loads only where it was written (one per rank under tensor
        // parallelism too: Note [Checkpoints under tensor parallelism]).
        const bool sharded = optimizers_[o]->state_layout() != zero::DistributedOptimizer::StateLayout::Whole ||
                             plan_.tp > 1 || has_pipeline();
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
      // What of each parameter's state this rank keeps: its piece (its rows under FSDP, of its
      // tensor-parallel box when the plan cut it).
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
                                                          state.value("pipeline", false) || has_pipeline());
      if (pieces) {  // stage 2 and FSDP: this rank's pieces, built from the staged state now (checked)
        std::unordered_map<const void*, const torch::optim::OptimizerParamState*> by_param;
        for (const auto& [param, st] : staged.named[o].states) by_param[param.unsafeGetTensorImpl()] = st.get();
        staged.flat.resize(optimizers_.size());
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
    TANDEM_CHECK(positions.size() == loaders_.size(), "load_state: ", dir, " holds the position of ", positions.size(),
                 " loader(s), this Accelerator prepared ", loaders_.size());
    for (size_t l = 0; l < loaders_.size(); ++l) {
      const auto epoch = positions[l].at("epoch").get<int64_t>();
      const auto done = positions[l].at("samples_done").get<int64_t>();
      TANDEM_CHECK(epoch >= 0 && done >= 0 && done <= loaders_[l].dataset_size, "load_state: ", dir, ": loader ", l,
                   " stopped at sample ", done, " of epoch ", epoch, ", outside its ", loaders_[l].dataset_size,
                   " samples: the checkpoint belongs to other data");
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
  } catch (const std::exception& e) {
    failure = one_line(e);
  }
  if (pg_ && pg_->size() > 1) {
    at::Tensor failed = at::full({1}, failure.empty() ? 0 : 1, at::kInt);
    pg_->all_reduce(failed, comm::ReduceOp::Max);
    TANDEM_CHECK(failure.empty(), failure);
    TANDEM_CHECK(failed.item<int>() == 0, "load_state: another process could not read ", dir,
                 " (its error says why); nothing was loaded");
  }
  TANDEM_CHECK(failure.empty(), failure);

  // Everything is read and checked on every rank: apply it.
  for (size_t m = 0; m < models_.size(); ++m) models_[m].load(staged.weights[m]);
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    torch::optim::Optimizer& optimizer = optimizers_[o]->optimizer();
    if (zero::PartitionedOptimizer* pieces = optimizers_[o]->partitioned()) {
      accelerate::apply_optimizer_options(optimizer, staged.named[o].options);
      pieces->install_state(std::move(staged.flat[o]));
      continue;
    }
    if (staged.archives[o].empty()) {
      accelerate::apply_optimizer_state(optimizer, held_parameters(o), std::move(staged.named[o]));
      continue;
    }
    torch::serialize::InputArchive archive;
    std::istringstream in(staged.archives[o]);
    archive.load_from(in);
    optimizer.load(archive);
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
