// save_state: every model's and optimizer's pieces through one writer (Note [One save path]).
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>
#include <torch/serialize/output-archive.h>

#include "accelerate/optimizer_state.h"
#include "accelerate/send_to_main.h"
#include "accelerate/sharded_tensors.h"
#include "accelerate/state_format.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/error.h"
#include "tandem/nn/region_rng.h"
#include "tandem/zero/partitioned_optimizer.h"

namespace tandem {

using accelerate::kStateFormat;
using accelerate::model_file;
using accelerate::names_for;
using accelerate::optimizer_file;

namespace {

std::string optimizer_bytes(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
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

// Note [Sharded checkpoints]
// Under FSDP no process holds a whole model, and a checkpoint must not make one: every rank
// writes its shards' rows of the weights (model_<m>.rank<r>.safetensors) and of the optimizer's
// state (optimizer_<o>.rank<r>.safetensors), Note [Sharded files]; a loader at any world
// size and under any strategy reads the rows it needs from whichever files hold them. The files
// travel to the main process one rank at a time (send_to_main), so saving needs no shared file
// system and the main process never holds more than two ranks' shards. Whole models (DDP, ZeRO,
// one process) keep one model_<m>.safetensors, written by the main process. Under HSDP the
// replicas hold the same rows: only the first replica's processes write theirs (Layout::counts),
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
// Note [One save path]
// Models and optimizers are saved alike: each gives the pieces of its tensors this process
// writes (model_pieces, optimizer_pieces: a box of each whole tensor, with its offsets and whole
// shape, where the tensor's layout says this copy is the one that counts), and one writer writes
// them: as one file from the main process when its copies are the ones that count (a model whole
// and no pipeline; an optimizer whose state is whole on every process, neither ZeRO-1's by owner
// nor FSDP's by rows, and not laid out by tensor or pipeline parallelism), else one file per rank. An optimizer's state
// tensor lies as its parameter; its "step" is one number per parameter, the first process of the
// parameter's stage writes it; ZeRO-1's owner writes what it keeps; ZeRO-2 gathers its slices
// into whole tensors (collective), the main process's copy counting. The files are the ones each
// strategy wrote before, so a checkpoint loads whichever Tandem wrote it.
std::vector<std::pair<Accelerator::ModelSlot, at::Tensor>> Accelerator::counted_tensors(
    const std::vector<size_t>& members) const {
  std::vector<std::pair<ModelSlot, at::Tensor>> out;
  for (size_t member : members) {
    auto slots = models_[member].layout();
    const auto held = models_[member].held();  // the same names, in the same order
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].layout.counts()) out.emplace_back(std::move(slots[i]), held[i].second);
    }
  }
  return out;
}

std::vector<accelerate::ChunkPiece> Accelerator::model_pieces(const std::vector<size_t>& members,
                                                               bool& one_file) const {
  one_file = !has_pipeline();
  for (size_t member : members) {
    for (const auto& slot : models_[member].layout()) one_file = one_file && slot.layout.whole();
  }
  std::vector<accelerate::ChunkPiece> pieces;
  for (auto& [slot, tensor] : counted_tensors(members)) {
    pieces.push_back({slot.name, tensor, slot.layout.chunk.offsets, slot.layout.shape});
  }
  return pieces;
}

std::vector<accelerate::ChunkPiece> Accelerator::optimizer_pieces(size_t o, const accelerate::ParamNames& names) {
  zero::DistributedOptimizer& prepared = *optimizers_[o];
  zero::PartitionedOptimizer* partitioned = prepared.partitioned();
  const auto kind = prepared.state_layout();
  std::vector<accelerate::ChunkPiece> pieces;
  auto whole = [&](std::string name, const at::Tensor& t) { pieces.push_back({std::move(name), t, {}, t.sizes().vec()}); };
  // A parameter's step: whole on its stage's processes, the first one's counts.
  auto step_counts = [&](const at::Tensor& param) { return layout_of(param, {}, {}, std::nullopt).counts(); };
  if (kind == zero::DistributedOptimizer::StateLayout::ByRows) {  // FSDP: each state tensor's rows
    for (auto& owned : partitioned->owned_state()) {
      const std::string name = names.at(owned.param.unsafeGetTensorImpl()) + "." + owned.key;
      if (owned.key == "step") {
        if (step_counts(owned.param)) whole(name, owned.rows);
        continue;
      }
      const comm::Layout l = layout_of(owned.param, owned.whole_shape, tp_cut_of(owned.param),
                                       std::make_pair(owned.first_row, owned.rows.size(0)));
      if (l.counts()) pieces.push_back({name, owned.rows, l.chunk.offsets, l.shape});
    }
    return pieces;
  }
  if (partitioned) {  // ZeRO-2: the flat slices gathered into whole tensors (collective)
    for (auto& [param, state] : partitioned->gather_state()) {
      for (auto& [key, t] : state) {
        if (is_main_process()) whole(names.at(param.unsafeGetTensorImpl()) + "." + key, t);
      }
    }
    return pieces;
  }
  // The parameters' own state: every parameter's (a whole optimizer), or the owned ones' (ZeRO-1).
  const bool by_owner = kind == zero::DistributedOptimizer::StateLayout::ByParameter;
  for (const auto& p : held_parameters(o)) {
    const comm::Layout l = layout_of(p, p.sizes().vec(), tp_cut_of(p), std::nullopt);
    const std::string step = names.at(p.unsafeGetTensorImpl()) + ".step";
    for (auto& [name, t] : accelerate::named_state(prepared.optimizer(), {p}, names)) {
      if (name == step) {
        if (by_owner || step_counts(p)) whole(name, t);
      } else if (by_owner || l.counts()) {
        pieces.push_back({name, t, l.chunk.offsets, l.shape});
      }
    }
  }
  return pieces;
}

bool Accelerator::state_per_rank(size_t o) const {
  return optimizers_[o]->state_layout() != zero::DistributedOptimizer::StateLayout::Whole || plan_.tp > 1 ||
         has_pipeline();
}

namespace {

// Under a pipeline each process's param groups hold its stages' parameters: the checkpoint's
// hold every stage's (in rank order, each name once), on the main process. Collective.
nlohmann::json describe_every_stage(const std::shared_ptr<comm::ProcessGroup>& pg, nlohmann::json entry) {
  std::vector<nlohmann::json> described;
  accelerate::send_to_main(pg, "save_state", [&] { return entry.dump(); },
                           [&](int, std::string bytes) { described.push_back(nlohmann::json::parse(bytes)); });
  if (described.empty()) return entry;  // not the main process
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
  return entry;
}

}  // namespace

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
  // Note [One save path]: one file from the main process, or every rank's (collective). Returns the names.
  auto write = [&](const std::function<std::string(int, bool)>& file, const std::function<std::string()>& bytes,
                   bool one_file) {
    nlohmann::json files = nlohmann::json::array();
    if (one_file) {
      attempt([&] { writer->add_file(file(0, false), bytes()); });
      files.push_back(file(0, false));
      return files;
    }
    accelerate::send_to_main(pg_, "save_state", bytes, [&](int r, std::string piece) {
      attempt([&] { writer->add_file(file(r, true), piece); });
    });
    for (int r = 0; r < world_.world_size; ++r) files.push_back(file(r, true));
    return files;
  };

  const auto saved_models = checkpoint_models();
  nlohmann::json model_files = nlohmann::json::array();
  for (size_t m = 0; m < saved_models.size(); ++m) {
    bool one_file = true;
    const auto pieces = model_pieces(saved_models[m], one_file);
    model_files.push_back(write([&](int r, bool sharded) { return model_file(m, r, sharded); },
                                [&] { return accelerate::chunk_pieces_bytes(pieces); }, one_file));
  }

  // Note [Optimizer state by name]; a type without a named format is a LibTorch archive.
  const auto identities = model_identities();
  nlohmann::json optimizer_state = nlohmann::json::array();
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    auto& optimizer = optimizers_[o]->optimizer();
    const auto groups = optimizer_groups(o);
    const auto names = names_for(identities, groups);
    const bool named = !accelerate::named_optimizer_type(optimizer).empty();
    nlohmann::json entry{{"type", ""}};
    const bool one_file = !state_per_rank(o);
    std::vector<accelerate::ChunkPiece> pieces;
    if (named) {
      entry = accelerate::describe_optimizer(optimizer, groups, names);
      if (has_pipeline()) entry = describe_every_stage(pg_, std::move(entry));
      pieces = optimizer_pieces(o, names);
    }
    entry["sharded"] = !one_file;
    entry["files"] = write([&](int r, bool sharded) { return optimizer_file(o, r, sharded, named); },
                           [&] { return named ? accelerate::chunk_pieces_bytes(pieces) : optimizer_bytes(optimizer); },
                           one_file);
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
    state["pipeline"] = has_pipeline();
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

}  // namespace tandem
