#pragma once
// Pipeline schedules (PyTorch's ScheduleGPipe, Schedule1F1B and ScheduleInterleaved1F1B): the
// order in which a process runs the forwards and backwards of a step's microbatches on its
// stages. With P processes, m microbatches and v stages per process:
//
//   GPipe        every microbatch forward, then every one backward: simple, and a stage holds
//                the activations of all m microbatches at once. One stage per process.
//   1F1B         stage s runs P - s - 1 forwards first, then alternates one forward and one
//                backward, then the last backwards: the same bubble, (P - 1) / (m + P - 1) of the
//                step, and at most P - s microbatches' activations held at once. One stage per
//                process.
//   Interleaved  v stages per process (stage s on rank s mod P), Megatron-LM's interleaved 1F1B:
//   1F1B         the forwards go P microbatches at a time through each of the process's stages in
//                turn, the backwards likewise from the last; the bubble shrinks to
//                (P - 1) / (v m + P - 1) of the step, for v times the messages. m must be a
//                multiple of P.
//
// step(inputs, targets) splits the batch on dim 0 into m microbatches (sizes as at::tensor_split:
// the first ones one larger when m does not divide the batch), reads `inputs` where stage 0 runs
// and `targets` where the last stage runs, and leaves every stage's parameters with the
// gradients of the whole batch's loss: with Reduction::Mean the loss of microbatch i (its mean)
// counts n_i / n, so the sum is the mean over the whole batch, even for uneven microbatches; with
// Sum it counts as it is. It returns the microbatches' losses, unscaled, where the last stage runs
// (empty elsewhere). Gradients accumulate into .grad as backward() does: zero them between steps.
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "tandem/pp/stage.h"

namespace tandem {
class CpuMemoryTracker;
}

namespace tandem::pp {

/// The loss of one microbatch's output against its targets (a scalar).
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

struct ScheduleOptions {
  /// How the loss function reduces over a microbatch: Mean (the microbatches' losses weighted by
  /// their sizes) or Sum (added as they are).
  TORCH_ARG(at::Reduction::Reduction, reduction) = at::Reduction::Mean;
  /// Count the bytes this process allocates on the CPU during a step (Note [Step measurements]
  /// in schedule.cpp): StepMeasurement::peak_bytes. Off by default (each allocation then takes a
  /// lock and a map entry).
  TORCH_ARG(bool, track_memory) = false;
};

enum class ActionKind { Forward, Backward };
/// One action of a schedule: the forward or backward of `microbatch` on `stage` (a stage index of
/// the whole pipeline).
struct Action {
  ActionKind kind;
  int microbatch;
  int stage;
};

// The orders of the schedules, for the process of rank `rank` among `processes` (pure functions:
// the schedules run them; tests and tools read them without processes).
std::vector<Action> gpipe_actions(int processes, int rank, int microbatches);
std::vector<Action> one_f_one_b_actions(int processes, int rank, int microbatches);
std::vector<Action> interleaved_actions(int processes, int stages_per_process, int rank, int microbatches);

/// One message of a step between two processes: the activation stage `from` sends to stage
/// from + 1 (forward), or the gradient it sends back to stage from - 1, of `microbatch`.
struct Message {
  bool gradient = false;
  int from = 0;
  int microbatch = 0;
  bool operator==(const Message& o) const {
    return gradient == o.gradient && from == o.from && microbatch == o.microbatch;
  }
  bool operator<(const Message& o) const {
    return std::tie(gradient, from, microbatch) < std::tie(o.gradient, o.from, o.microbatch);
  }
};
/// A message as one process sees it: sent to, or received from, `peer`.
struct Transfer {
  Message message;
  int peer = 0;
  bool send = false;
};
/// One step of a process's plan (Note [Batched exchanges] in schedule.cpp): its action at that
/// step of the pipeline's grid, if any (an index into its order), then the batch of messages
/// every process exchanges at that step: what its action produced, and what its neighbours'
/// actions at that step produced for it.
struct PlanStep {
  std::optional<size_t> action;
  std::vector<Transfer> batch;
};
/// Process `rank`'s plan, given every process's order (`order(r)`) in a pipeline of `processes`
/// processes and `stages` stages. Messages between stages of the same process are handed over in
/// memory and are not in it. Throws tandem::Error when the orders cannot all run.
std::vector<PlanStep> exchange_plan(const std::function<std::vector<Action>(int rank)>& order, int processes,
                                    int stages, int rank);

/// What the last step() measured on this process (Note [Step measurements] in schedule.cpp).
struct StepMeasurement {
  double seconds = 0;          // the whole step
  double blocked_seconds = 0;  // waiting for a neighbour: in receives, and for the sends at the end
  /// blocked / seconds: this process's share of the pipeline's bubble (an ideal pipeline of equal
  /// stages: (P - 1) / (m + P - 1), or (P - 1) / (v m + P - 1) interleaved).
  double bubble() const { return seconds > 0 ? blocked_seconds / seconds : 0; }
  /// With track_memory: the most bytes allocated on the CPU during the step and alive at once,
  /// beyond those alive when it began (activations kept for backward, and backward's transients).
  std::optional<int64_t> peak_bytes;
};

class Schedule {
 public:
  virtual ~Schedule();
  /// One training step over the batch (Note [Pipeline step] in schedule.cpp). Every process of
  /// the pipeline calls it; `inputs` matter where stage 0 runs, `targets` where the last stage
  /// runs (pass an undefined tensor elsewhere). One-line tandem::Error for a batch smaller than
  /// the number of microbatches, and for any failure inside it, naming the stage, forward or
  /// backward, and the microbatch ("pp: stage 1 failed in the forward of microbatch 2: ...").
  std::vector<at::Tensor> step(const at::Tensor& inputs, const at::Tensor& targets);

  /// Forwards only, without autograd (evaluation): the microbatches of `inputs` (read where stage
  /// 0 runs) through every stage, in the order of the schedule's forwards. Returns the last
  /// stage's outputs, concatenated on dim 0, where it runs (undefined elsewhere). Failures are
  /// named as step()'s.
  at::Tensor evaluate(const at::Tensor& inputs);

  using Kind = ActionKind;
  /// This process's actions for one step, in order (what step() runs; tests read it).
  const std::vector<Action>& actions() const { return actions_; }
  /// The last step's measurements on this process.
  const StepMeasurement& last_step() const { return measured_; }

 protected:
  /// `stages` are this process's stages of one pipeline (one group, stage s on rank s mod P), each
  /// once, and only one unless `many_per_process`. One-line tandem::Error when they are not, and
  /// when `microbatches` < P (a pipeline that never fills: refused rather than run with stages
  /// idle).
  Schedule(std::vector<Stage*> stages, int microbatches, LossFn loss, ScheduleOptions options, const char* name,
           bool many_per_process);
  /// Sets this process's actions to `order(rank)`; `order` gives any process's (Note [Releasing
  /// sends] in stage.cpp reads the previous stages' processes' orders).
  void set_order(const std::function<std::vector<Action>(int rank)>& order);
  std::vector<Stage*> stages_;  // by stage index
  int microbatches_;

 private:
  struct State;
  std::vector<Action> actions_;
  /// By stage (its place in stages_), then microbatch j: how many backwards the previous stage
  /// has run once its activation of j arrives (their gradient sends can be released).
  std::vector<std::vector<int>> backwards_before_;
  /// By stage: the microbatch of its last backward in this process's order (where a
  /// data-parallel stage synchronises).
  std::vector<int> last_backward_;
  LossFn loss_;
  ScheduleOptions options_;
  StepMeasurement measured_;
  std::unique_ptr<CpuMemoryTracker> memory_;  // with track_memory
  Stage& stage(int index) const;
  bool holds(int index) const;
  std::vector<PlanStep> plan_;  // Note [Batched exchanges]
  std::vector<Action> forward_actions_;  // evaluate()'s: the forwards of actions_
  std::vector<PlanStep> forward_plan_;
  /// Every stage's batch size for this step (or evaluate()): the first stage's inputs, checked
  /// against the last stage's targets (-1: none here), agreed by one all-gather over the group so
  /// that every stage knows every microbatch's size and a bad batch stops every stage at once.
  void agree_on_batch(State& state, int64_t inputs, int64_t targets) const;
  /// Runs `plan` (step()'s, or evaluate()'s forwards) over `actions`.
  void run_plan(const std::vector<PlanStep>& plan, const std::vector<Action>& actions, State& state, bool evaluating,
                std::vector<at::Tensor>* outputs);
  /// Issues one step's batch: the sends waiting in `state` and the receives it names, which go
  /// to `state`'s mailbox.
  void exchange(const std::vector<Transfer>& batch, State& state);
  /// The message `m` from the mailbox, waited for (counted as blocked), on the stage's device.
  at::Tensor take_message(const Message& m, State& state);
  /// The input of forward `a`: stage 0's microbatch, what the previous stage handed over in
  /// memory, or its message.
  at::Tensor input_of(const Action& a, State& state);
  /// Hands forward `a`'s output to the next stage: in memory (a copy, as a message is) or by the
  /// next exchange.
  void pass_on(const Action& a, const at::Tensor& y, State& state);
  /// The next tensor handed over in memory to `a`'s stage.
  static at::Tensor take(std::map<int, std::deque<at::Tensor>>& box, const Action& a);
  /// One action of step(), with what its backward needs kept in `state`.
  void run(const Action& a, State& state);
};

class ScheduleGPipe : public Schedule {
 public:
  /// One stage per process (`stage`'s pipeline has as many stages as its group has processes).
  ScheduleGPipe(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options = {});
};

class Schedule1F1B : public Schedule {
 public:
  /// One stage per process (`stage`'s pipeline has as many stages as its group has processes).
  Schedule1F1B(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options = {});
};

class ScheduleInterleaved1F1B : public Schedule {
 public:
  /// `stages`: this process's stages r, r + P, ... of the pipeline (v = num_stages / P of them).
  /// One-line tandem::Error when `microbatches` is not a multiple of P.
  ScheduleInterleaved1F1B(std::vector<Stage*> stages, int microbatches, LossFn loss, ScheduleOptions options = {});
};

}  // namespace tandem::pp
