#pragma once
// Pipeline schedules (PyTorch's ScheduleGPipe and Schedule1F1B): the order in which a stage runs
// the forwards and backwards of a step's microbatches.
//
//   GPipe  every microbatch forward, then every one backward: simple, and a stage holds the
//          activations of all m microbatches at once.
//   1F1B   stage s runs p - s - 1 forwards first, then alternates one forward and one backward,
//          then the last backwards: the same bubble, (p - 1) / (m + p - 1) of the step, and at
//          most p - s microbatches' activations held at once.
//
// step(inputs, targets) splits the batch on dim 0 into m microbatches (sizes as at::tensor_split:
// the first ones one larger when m does not divide the batch), reads `inputs` on the first stage
// and `targets` on the last, and leaves every stage's parameters with the gradients of the
// whole batch's loss: with Reduction::Mean the loss of microbatch i (its mean) counts
// n_i / n, so the sum is the mean over the whole batch, even for uneven microbatches; with Sum it
// counts as it is. It returns the microbatches' losses, unscaled, on the last stage (empty
// elsewhere). Gradients accumulate into .grad as backward() does: zero them between steps.
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "tandem/pp/stage.h"

namespace tandem::pp {

/// The loss of one microbatch's output against its targets (a scalar).
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

struct ScheduleOptions {
  /// How the loss function reduces over a microbatch: Mean (the microbatches' losses weighted by
  /// their sizes) or Sum (added as they are).
  TORCH_ARG(at::Reduction::Reduction, reduction) = at::Reduction::Mean;
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  /// One training step over the batch (Note [Pipeline step] in schedule.cpp). Every stage of the
  /// pipeline calls it; `inputs` matter on the first stage, `targets` on the last (pass an
  /// undefined tensor elsewhere). One-line tandem::Error for a batch smaller than the number of
  /// microbatches, and for any failure inside it, naming the stage, forward or backward, and the
  /// microbatch ("pp: stage 1 failed in the forward of microbatch 2: ...").
  std::vector<at::Tensor> step(const at::Tensor& inputs, const at::Tensor& targets);

  enum class Kind { Forward, Backward };
  struct Action {
    Kind kind;
    int microbatch;
  };
  /// This stage's actions for one step, in order (what step() runs; tests read it).
  const std::vector<Action>& actions() const { return actions_; }

 protected:
  /// One-line tandem::Error when `microbatches` < the number of stages (a pipeline that never
  /// fills: refused, as the issue asks, rather than run with stages idle).
  Schedule(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options, const char* name);
  std::vector<Action> actions_;
  Stage& stage_;
  int microbatches_;

 private:
  LossFn loss_;
  ScheduleOptions options_;
  /// One action of step(): `in`, `out`, `scaled` (by microbatch) keep what its backward needs.
  void run(const Action& a, const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& ys, int64_t total,
           std::vector<at::Tensor>& in, std::vector<at::Tensor>& out, std::vector<at::Tensor>& scaled,
           std::vector<at::Tensor>& losses);
};

class ScheduleGPipe : public Schedule {
 public:
  ScheduleGPipe(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options = {});
};

class Schedule1F1B : public Schedule {
 public:
  Schedule1F1B(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options = {});
};

}  // namespace tandem::pp
