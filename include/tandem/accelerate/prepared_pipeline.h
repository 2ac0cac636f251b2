#pragma once
// PreparedPipeline: this process's stages of a pipeline the Accelerator composed with the other
// dimensions of its mesh (Accelerator::prepare_pipeline; docs/guide-pp.md). Each stage's module
// is prepared as prepare_model prepares a model (DDP or FSDP over the data-parallel dimensions,
// autocast), and a schedule runs them: step(inputs, targets) is a whole training step's forward
// and backward, the gradients synchronised across the replicas once, at each stage's last
// backward.
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "tandem/accelerate/prepared_model.h"
#include "tandem/pp/schedule.h"
#include "tandem/pp/stage.h"

namespace tandem {

enum class PipelineSchedule { GPipe, OneFOneB, Interleaved1F1B };

struct PipelineOptions {
  /// The order of the microbatches (tandem/pp/schedule.h). Interleaved1F1B takes several stages
  /// per process.
  TORCH_ARG(PipelineSchedule, schedule) = PipelineSchedule::OneFOneB;
  /// Microbatches per step: at least pp_size (a multiple of it for Interleaved1F1B). 0: 2 x pp_size.
  TORCH_ARG(int, microbatches) = 0;
  /// How the loss reduces over a microbatch (Mean: weighted by the microbatches' sizes).
  TORCH_ARG(at::Reduction::Reduction, reduction) = at::Reduction::Mean;
  /// Count the bytes a step holds on the CPU (pp::StepMeasurement::peak_bytes).
  TORCH_ARG(bool, track_memory) = false;
};

template <typename ModuleHolder>
class PreparedPipeline {
 public:
  PreparedPipeline(std::vector<PreparedModel<ModuleHolder>> models, std::vector<std::unique_ptr<pp::Stage>> stages,
                   std::unique_ptr<pp::Schedule> schedule)
      : models_(std::move(models)), stages_(std::move(stages)), schedule_(std::move(schedule)) {}

  /// One training step (pp::Schedule::step): `inputs` are read where stage 0 runs, `targets`
  /// where the last stage runs; returns the microbatches' losses there (empty elsewhere).
  std::vector<at::Tensor> step(const at::Tensor& inputs, const at::Tensor& targets) {
    return schedule_->step(inputs, targets);
  }
  /// Forwards only, without autograd (pp::Schedule::evaluate): the last stage's outputs of the
  /// whole batch where it runs, undefined elsewhere. Put the models in eval() mode first.
  at::Tensor evaluate(const at::Tensor& inputs) { return schedule_->evaluate(inputs); }
  /// Whether this process runs stage 0 (reads the inputs) / the last stage (the targets, the loss).
  bool is_first() const { return stages_.front()->is_first(); }
  bool is_last() const { return stages_.back()->is_last(); }
  /// This process's stages, prepared, in stage order (their parameters are the optimizer's).
  std::vector<PreparedModel<ModuleHolder>>& models() { return models_; }
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> all;
    for (const auto& m : models_) {
      for (const auto& p : m->parameters()) all.push_back(p);
    }
    return all;
  }
  const pp::Schedule& schedule() const { return *schedule_; }
  const pp::StepMeasurement& last_step() const { return schedule_->last_step(); }

 private:
  std::vector<PreparedModel<ModuleHolder>> models_;
  std::vector<std::unique_ptr<pp::Stage>> stages_;
  std::unique_ptr<pp::Schedule> schedule_;
};

}  // namespace tandem
