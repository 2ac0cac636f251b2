// Pipeline parallelism against one process: the whole model of 2 x p blocks on the whole batch
// (the oracle) and the same model cut into p stages, one per rank, run by GPipe and 1F1B over m
// microbatches. Gradients, and the weights after three SGD steps, equal the oracle's to fp32
// reduction-order tolerance; the two schedules equal each other bit for bit (the same sums in the
// same order); uneven microbatches and a sum-reduced loss too. Run as a world of one and as every
// rank of a `tandem run` job (2 and 4 ranks).
#include <gtest/gtest.h>

#include <csignal>
#include <algorithm>
#include <stdexcept>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>

#include "support/distributed_main.h"
#include "support/errors.h"
#include "tandem/pp/schedule.h"
#include "tandem/pp/stage.h"

namespace pp = tandem::pp;

namespace {

using tandem::test::pg;
using tandem::test::shared_pg;
int W() { return pg().size(); }
int R() { return pg().rank(); }

constexpr int64_t kWidth = 12;

// Block b: Linear then tanh; two blocks per stage. The same weights on every rank (seed 3).
torch::nn::Sequential whole_model(int stages) {
  torch::manual_seed(3);
  torch::nn::Sequential net;
  for (int b = 0; b < 2 * stages; ++b) {
    net->push_back(torch::nn::Linear(kWidth, kWidth));
    net->push_back(torch::nn::Tanh());
  }
  return net;
}

// Stage s's part of `whole`: its two blocks, with copies of their weights.
torch::nn::Sequential stage_part(const torch::nn::Sequential& whole, int s) {
  torch::nn::Sequential part;
  at::NoGradGuard no_grad;
  for (int k = 4 * s; k < 4 * s + 4; k += 2) {
    const auto* source = whole->ptr(static_cast<size_t>(k))->as<torch::nn::Linear>();
    torch::nn::Linear copy(kWidth, kWidth);
    copy->weight.copy_(source->weight);
    copy->bias.copy_(source->bias);
    part->push_back(copy);
    part->push_back(torch::nn::Tanh());
  }
  return part;
}

std::vector<at::Tensor> stage_params_of_whole(const torch::nn::Sequential& whole, int s) {
  std::vector<at::Tensor> out;
  for (int k = 4 * s; k < 4 * s + 4; ++k) {
    for (const auto& p : whole->ptr(static_cast<size_t>(k))->parameters()) out.push_back(p);
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> batch(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {at::randn({n, kWidth}, gen), at::randn({n, kWidth}, gen)};
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& target, at::Reduction::Reduction reduction) {
  return at::mse_loss(out, target, reduction);
}

enum class Which { GPipe, OneFOneB };

std::unique_ptr<pp::Schedule> make_schedule(Which which, pp::Stage& stage, int m, at::Reduction::Reduction reduction) {
  pp::LossFn loss = [reduction](const at::Tensor& out, const at::Tensor& t) { return mse(out, t, reduction); };
  const auto options = pp::ScheduleOptions().reduction(reduction);
  if (which == Which::GPipe) return std::make_unique<pp::ScheduleGPipe>(stage, m, loss, options);
  return std::make_unique<pp::Schedule1F1B>(stage, m, loss, options);
}

// Three SGD steps of the pipeline (this rank's stage) and of one process on the whole batch; the
// gradients after each step and the weights after the last. Returns this stage's gradients of
// the first step (to compare the schedules with each other).
std::vector<at::Tensor> train_against_one_process(Which which, int m, int64_t n, at::Reduction::Reduction reduction) {
  const int p = W();
  torch::nn::Sequential whole = whole_model(p);
  torch::nn::Sequential part = stage_part(whole, R());
  pp::Stage stage(part, R(), p, shared_pg());
  auto schedule = make_schedule(which, stage, m, reduction);
  torch::optim::SGD ref_opt(whole->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD opt(part->parameters(), torch::optim::SGDOptions(0.1));
  std::vector<at::Tensor> first_grads;
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(n, 50 + static_cast<uint64_t>(step));
    at::Tensor ref_loss = mse(whole->forward(x), y, reduction);
    ref_loss.backward();
    const auto losses = schedule->step(stage.is_first() ? x : at::Tensor(), stage.is_last() ? y : at::Tensor());
    if (stage.is_last()) {
      EXPECT_EQ(static_cast<int>(losses.size()), m);
      // The microbatches' losses recombine to the whole batch's.
      double combined = 0;
      const auto targets = at::tensor_split(y, m, 0);
      for (int i = 0; i < m; ++i) {
        combined += losses[static_cast<size_t>(i)].item<double>() *
                    (reduction == at::Reduction::Mean ? static_cast<double>(targets[static_cast<size_t>(i)].size(0)) / n : 1.0);
      }
      EXPECT_NEAR(combined, ref_loss.item<double>(), 1e-5 * std::max(1.0, std::abs(ref_loss.item<double>())));
    } else {
      EXPECT_TRUE(losses.empty());
    }
    const auto mine = part->parameters();
    const auto theirs = stage_params_of_whole(whole, R());
    EXPECT_EQ(mine.size(), theirs.size());
    for (size_t k = 0; k < mine.size(); ++k) {
      if (!mine[k].grad().defined()) {
        ADD_FAILURE() << "step " << step << ", parameter " << k << " has no gradient";
        continue;
      }
      EXPECT_TRUE(at::allclose(mine[k].grad(), theirs[k].grad(), 1e-5, 1e-6))
          << "step " << step << ", parameter " << k << " of stage " << R() << ": largest difference "
          << (mine[k].grad() - theirs[k].grad()).abs().max().item<double>();
      if (step == 0) first_grads.push_back(mine[k].grad().clone());
    }
    ref_opt.step();
    ref_opt.zero_grad();
    opt.step();
    opt.zero_grad();
  }
  const auto mine = part->parameters();
  const auto theirs = stage_params_of_whole(whole, R());
  for (size_t k = 0; k < mine.size(); ++k) {
    EXPECT_TRUE(at::allclose(mine[k], theirs[k], 1e-5, 1e-6)) << "weights after 3 steps, parameter " << k;
  }
  return first_grads;
}

}  // namespace

TEST(Pipeline, GPipeAnd1F1BEqualOneProcessAndEachOther) {
  for (int m : {W(), 2 * W()}) {
    const auto gpipe = train_against_one_process(Which::GPipe, m, 4 * W(), at::Reduction::Mean);
    const auto one_f_one_b = train_against_one_process(Which::OneFOneB, m, 4 * W(), at::Reduction::Mean);
    ASSERT_EQ(gpipe.size(), one_f_one_b.size());
    for (size_t k = 0; k < gpipe.size(); ++k) {
      EXPECT_TRUE(at::equal(gpipe[k], one_f_one_b[k])) << "m " << m << ", parameter " << k;
    }
  }
}

TEST(Pipeline, UnevenMicrobatchesWeighTheirLossesBySize) {
  // 2m + 1 samples in m = W + 1 microbatches: the first one sample larger than the others.
  const int m = W() + 1;
  train_against_one_process(Which::OneFOneB, m, 2 * m + 1, at::Reduction::Mean);
  train_against_one_process(Which::GPipe, m, 2 * m + 1, at::Reduction::Mean);
}

TEST(Pipeline, ASumReducedLossIsNotScaled) {
  train_against_one_process(Which::OneFOneB, 2 * W(), 4 * W(), at::Reduction::Sum);
}

// 1F1B holds at most p - s microbatches' activations on stage s; GPipe all m of them.
TEST(Pipeline, OneFOneBBoundsTheMicrobatchesInFlight) {
  const int p = W(), m = 2 * W() + 1;
  torch::nn::Sequential part = stage_part(whole_model(p), R());
  pp::Stage stage(part, R(), p, shared_pg());
  auto in_flight = [](const pp::Schedule& s) {
    int now = 0, most = 0;
    for (const auto& a : s.actions()) {
      now += a.kind == pp::Schedule::Kind::Forward ? 1 : -1;
      most = std::max(most, now);
    }
    EXPECT_EQ(now, 0);
    return most;
  };
  const auto loss = [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); };
  EXPECT_EQ(in_flight(pp::Schedule1F1B(stage, m, loss)), std::min(p - R(), m));
  EXPECT_EQ(in_flight(pp::ScheduleGPipe(stage, m, loss)), m);
  // Every microbatch once forward and once backward, its backward after its forward.
  pp::Schedule1F1B schedule(stage, m, loss);
  std::vector<int> seen(static_cast<size_t>(m), 0);
  for (const auto& a : schedule.actions()) {
    auto& state = seen[static_cast<size_t>(a.microbatch)];
    EXPECT_EQ(state, a.kind == pp::Schedule::Kind::Forward ? 0 : 1) << "microbatch " << a.microbatch;
    ++state;
  }
}

TEST(PipelineErrors, FewerMicrobatchesThanStagesAndTooSmallABatchAreOneLineErrors) {
  const int p = W();
  torch::nn::Sequential part = stage_part(whole_model(p), R());
  pp::Stage stage(part, R(), p, shared_pg());
  const auto loss = [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); };
  if (p > 1) {
    EXPECT_ERROR(pp::Schedule1F1B(stage, p - 1, loss),
                 "pp: 1F1B with " + std::to_string(p - 1) + " microbatches over " + std::to_string(p) +
                     " stages: a pipeline needs at least as many microbatches as stages to fill");
  }
  // A batch smaller than the microbatches: refused on the stages that read it, before any message.
  pp::ScheduleGPipe schedule(stage, 2 * p, loss);
  auto [x, y] = batch(2 * p - 1, 7);
  if (stage.is_first() || stage.is_last()) {
    EXPECT_ERROR(schedule.step(x, y), "pp: a batch of " + std::to_string(2 * p - 1) + " in " + std::to_string(2 * p) +
                                          " microbatches: each needs at least one sample");
  }
  EXPECT_ERROR(pp::Stage(part, p, p, shared_pg()),
               "pp: stage " + std::to_string(p) + " of " + std::to_string(p) + " does not exist (stages are numbered 0 to " +
                   std::to_string(p - 1) + ")");
  EXPECT_ERROR(pp::Stage(part, R(), p + 1, shared_pg()),
               "pp: " + std::to_string(p + 1) + " stages need a pipeline group of " + std::to_string(p + 1) +
                   " processes, one per stage; this one has " + std::to_string(p));
}

namespace {

// A stage's layers that fail at their `fail_at`-th forward: by raising, or by the process
// killing itself (SIGKILL: no handler, no message of its own).
struct FailingImpl : torch::nn::Module {
  FailingImpl(int fail_at, bool kill) : fail_at(fail_at), kill(kill) {
    layer = register_module("layer", torch::nn::Linear(kWidth, kWidth));
  }
  at::Tensor forward(const at::Tensor& x) {
    if (calls++ == fail_at) {
      if (kill) ::raise(SIGKILL);
      throw std::runtime_error("injected failure");
    }
    return layer(x);
  }
  torch::nn::Linear layer{nullptr};
  int fail_at, calls = 0;
  bool kill;
};
TORCH_MODULE(Failing);

// Stage `failing` fails in its third forward (microbatch 2); the others train normally. The job
// must end with that stage named, never hang: a stage blocked in a receive from it is stopped by
// the launcher when its process exits.
int run_failing_pipeline(int failing, bool kill) {
  Failing part(R() == failing ? 2 : -1, kill);
  pp::Stage stage(part, R(), W(), shared_pg());
  pp::Schedule1F1B schedule(stage, 2 * W(), [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); });
  auto [x, y] = batch(4 * W(), 9);
  schedule.step(x, y);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::test::Scenarios scenarios;
  scenarios["stage-1-raises"] = [] { return run_failing_pipeline(1, false); };
  scenarios["stage-2-killed"] = [] { return run_failing_pipeline(2, true); };
  return tandem::test::distributed_test_main(argc, argv, scenarios);
}
