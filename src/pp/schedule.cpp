#include "tandem/pp/schedule.h"

#include <algorithm>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "tandem/error.h"

namespace tandem::pp {

// Note [Pipeline step]
// Each stage runs its own list of actions (forward or backward of microbatch i) in order; the
// lists of neighbouring stages agree on the order of the messages between them, which is all a
// pipeline needs: sends are asynchronous (kept until the end of the step), receives block, and
// between two stages activations flow one way and gradients the other, each in its own order.
// - Forward i: the first stage takes microbatch i of the inputs; the others receive it, and mark
//   it as needing a gradient (what they send back). The last stage computes the loss of its
//   output against microbatch i of the targets; the others send the output on. Each keeps what
//   backward needs: the input and the output (the last stage, the scaled loss).
// - Backward i: the last stage runs backward from the loss scaled by n_i / n (Mean) or 1 (Sum);
//   the others receive the gradient of their output and run backward from it. All but the first
//   send their input's gradient back. Parameters accumulate the gradients of all microbatches:
//   the whole batch's, as one process on the whole batch would have them.
// - The end: every send is waited for, so that the step's messages are all delivered before the
//   optimizer changes the weights and the next step begins.

Schedule::Schedule(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options, const char* name)
    : stage_(stage), microbatches_(microbatches), loss_(std::move(loss)), options_(options) {
  TANDEM_CHECK(loss_, "pp: ", name, " needs a loss function");
  TANDEM_CHECK(microbatches_ >= stage.num_stages(), "pp: ", name, " with ", microbatches_, " microbatches over ",
               stage.num_stages(), " stages: a pipeline needs at least as many microbatches as stages to fill");
  TANDEM_CHECK(options_.reduction() == at::Reduction::Mean || options_.reduction() == at::Reduction::Sum,
               "pp: the loss's reduction must be Mean or Sum");
}

std::vector<at::Tensor> Schedule::step(const at::Tensor& inputs, const at::Tensor& targets) {
  const int m = microbatches_;
  std::vector<at::Tensor> xs, ys;
  auto split = [&](const at::Tensor& batch, const char* what) {
    TANDEM_CHECK(batch.defined(), "pp: stage ", stage_.index(), " needs the ", what);
    TANDEM_CHECK(batch.dim() > 0 && batch.size(0) >= m, "pp: a batch of ",
                 batch.dim() > 0 ? batch.size(0) : 0, " in ", m, " microbatches: each needs at least one sample");
    return at::tensor_split(batch, m, 0);
  };
  if (stage_.is_first()) xs = split(inputs, "inputs (the first stage reads them)");
  int64_t total = 0;
  if (stage_.is_last()) {
    ys = split(targets, "targets (the last stage reads them)");
    total = targets.size(0);
  }
  std::vector<at::Tensor> in(m), out(m), scaled(m), losses;
  for (const Action& a : actions_) {
    const int i = a.microbatch;
    // A failure names the stage, the action and the microbatch, led by the pipeline's first
    // failure (Note [The first failed stage] in stage.cpp); the launcher stops the other stages.
    try {
      run(a, xs, ys, total, in, out, scaled, losses);
    } catch (const std::exception& e) {
      throw Error(stage_.explain_failure("pp: stage " + std::to_string(stage_.index()) + " failed in the " +
                                         (a.kind == Kind::Forward ? "forward" : "backward") + " of microbatch " +
                                         std::to_string(i) + ": " + one_line(e)));
    }
  }
  stage_.wait_sends();
  return losses;
}

void Schedule::run(const Action& a, const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& ys,
                   int64_t total, std::vector<at::Tensor>& in, std::vector<at::Tensor>& out,
                   std::vector<at::Tensor>& scaled, std::vector<at::Tensor>& losses) {
  const int i = a.microbatch;
  if (a.kind == Kind::Forward) {
    at::Tensor x;
    if (stage_.is_first()) {
      x = xs[static_cast<size_t>(i)];
    } else {
      x = stage_.recv_activation();
      TANDEM_CHECK(at::isFloatingType(x.scalar_type()), "pp: stage ", stage_.index(), " received a ",
                   c10::toString(x.scalar_type()), " activation: what flows between stages must be floating point "
                   "(its gradient flows back)");
      x.requires_grad_(true);
    }
    at::Tensor y = stage_.forward(x);
    if (stage_.is_last()) {
      at::Tensor loss = loss_(y, ys[static_cast<size_t>(i)]);
      TANDEM_CHECK(loss.numel() == 1, "pp: the loss function returned ", loss.numel(), " values, not one");
      const double weight = options_.reduction() == at::Reduction::Mean
                                ? static_cast<double>(ys[static_cast<size_t>(i)].size(0)) / static_cast<double>(total)
                                : 1.0;
      scaled[static_cast<size_t>(i)] = loss * weight;
      losses.push_back(loss.detach());
    } else {
      stage_.send_activation(y);
      out[static_cast<size_t>(i)] = y;
    }
    in[static_cast<size_t>(i)] = x;
  } else {
    if (stage_.is_last()) {
      scaled[static_cast<size_t>(i)].backward();
      scaled[static_cast<size_t>(i)] = at::Tensor();
    } else {
      const at::Tensor& y = out[static_cast<size_t>(i)];
      torch::autograd::backward({y}, {stage_.recv_gradient(y)});
      out[static_cast<size_t>(i)] = at::Tensor();
    }
    if (!stage_.is_first()) {
      const at::Tensor& x = in[static_cast<size_t>(i)];
      stage_.send_gradient(x.grad().defined() ? x.grad() : at::zeros_like(x));
    }
    in[static_cast<size_t>(i)] = at::Tensor();
  }
}

ScheduleGPipe::ScheduleGPipe(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options)
    : Schedule(stage, microbatches, std::move(loss), options, "GPipe") {
  for (int i = 0; i < microbatches; ++i) actions_.push_back({Kind::Forward, i});
  for (int i = 0; i < microbatches; ++i) actions_.push_back({Kind::Backward, i});
}

Schedule1F1B::Schedule1F1B(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options)
    : Schedule(stage, microbatches, std::move(loss), options, "1F1B") {
  // Stage s first fills the pipeline below it (p - s - 1 forwards), then alternates.
  const int warmup = std::min(stage.num_stages() - stage.index() - 1, microbatches);
  for (int i = 0; i < warmup; ++i) actions_.push_back({Kind::Forward, i});
  for (int k = 0; k + warmup < microbatches; ++k) {
    actions_.push_back({Kind::Forward, warmup + k});
    actions_.push_back({Kind::Backward, k});
  }
  for (int k = microbatches - warmup; k < microbatches; ++k) actions_.push_back({Kind::Backward, k});
}

}  // namespace tandem::pp
