// The Accelerator's checkpoints, what save_state (save_state.cpp) and load_state (load_state.cpp)
// share: what a checkpoint holds of the prepared models and optimizers, and the files' names
// (docs/checkpoints.md; the files themselves: checkpoint_dir.h, safetensors.h; the optimizers'
// state: optimizer_state.h).
#include <algorithm>
#include <string>
#include <vector>

#include "accelerate/state_format.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/error.h"

namespace tandem {
namespace {

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& groups) {
  std::vector<at::Tensor> out;
  for (const auto& g : groups) out.insert(out.end(), g.begin(), g.end());
  return out;
}

}  // namespace

std::string accelerate::model_file(size_t model, int rank, bool sharded) {
  return "model_" + std::to_string(model) + (sharded ? ".rank" + std::to_string(rank) : "") + ".safetensors";
}

std::string accelerate::optimizer_file(size_t optimizer, int rank, bool sharded, bool named) {
  return "optimizer_" + std::to_string(optimizer) + (sharded ? ".rank" + std::to_string(rank) : "") +
         (named ? ".safetensors" : ".pt");
}

accelerate::ParamNames accelerate::names_for(const std::vector<std::vector<std::pair<std::string, at::Tensor>>>& models,
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

}  // namespace tandem
