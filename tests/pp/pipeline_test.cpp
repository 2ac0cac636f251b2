// Pipeline parallelism against one process: the whole model of 2 x p blocks on the whole batch
// (the oracle) and the same model cut into p stages, one per rank, run by GPipe and 1F1B over m
// microbatches, and into 2p stages of one block, two per rank, run by interleaved 1F1B.
// Gradients, and the weights after three SGD steps, equal the oracle's to fp32 reduction-order
// tolerance; the schedules equal each other bit for bit (the same sums in the same order);
// uneven microbatches and a sum-reduced loss too. Run as a world of one and as every rank of a
// `tandem run` job (2 and 4 ranks).
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <algorithm>
#include <stdexcept>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "support/compare.h"
#include "support/distributed_main.h"
#include "support/errors.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/comm/device_mesh.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "common/cpu_memory_tracker.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/pp/schedule.h"
#include "tandem/pp/stage.h"
#include "tandem/tp/random.h"

namespace pp = tandem::pp;

namespace {

using tandem::test::close_at_scale;
using tandem::test::pg;
using tandem::test::shared_pg;
int W() { return pg().size(); }
int R() { return pg().rank(); }

constexpr int64_t kWidth = 12;

// Block b: Linear then tanh; 2p blocks. The same weights on every rank (seed 3).
torch::nn::Sequential whole_model(int processes) {
  torch::manual_seed(3);
  torch::nn::Sequential net;
  for (int b = 0; b < 2 * processes; ++b) {
    net->push_back(torch::nn::Linear(kWidth, kWidth));
    net->push_back(torch::nn::Tanh());
  }
  return net;
}

// Block b's Linear of `whole`, a copy of its weights.
torch::nn::Linear copy_of_block(const torch::nn::Sequential& whole, int b) {
  at::NoGradGuard no_grad;
  const auto* source = whole->ptr(static_cast<size_t>(2 * b))->as<torch::nn::Linear>();
  torch::nn::Linear copy(kWidth, kWidth);
  copy->weight.copy_(source->weight);
  copy->bias.copy_(source->bias);
  return copy;
}

// Blocks [first, first + count) of `whole`, with copies of their weights.
torch::nn::Sequential part_of(const torch::nn::Sequential& whole, int first, int count) {
  torch::nn::Sequential part;
  for (int b = first; b < first + count; ++b) {
    part->push_back(copy_of_block(whole, b));
    part->push_back(torch::nn::Tanh());
  }
  return part;
}

// Stage s of one per process: blocks 2s and 2s + 1.
torch::nn::Sequential stage_part(const torch::nn::Sequential& whole, int s) { return part_of(whole, 2 * s, 2); }

std::pair<at::Tensor, at::Tensor> batch(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {at::randn({n, kWidth}, gen), at::randn({n, kWidth}, gen)};
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& target, at::Reduction::Reduction reduction) {
  return at::mse_loss(out, target, reduction);
}

enum class Which { GPipe, OneFOneB, Interleaved };

// This rank's pipeline: its stages (one per process, or, interleaved, the 2p blocks as 2p stages
// of one block, r and r + p here), their modules, and the schedule.
struct Pipeline {
  std::vector<torch::nn::Sequential> parts;
  std::vector<int> first_block;  // of each part
  std::vector<std::unique_ptr<pp::Stage>> stages;
  std::unique_ptr<pp::Schedule> schedule;
  bool first = false, last = false;
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> all;
    for (const auto& part : parts) {
      for (const auto& p : part->parameters()) all.push_back(p);
    }
    return all;
  }
};

Pipeline make_pipeline(Which which, const torch::nn::Sequential& whole, int m, pp::ScheduleOptions options) {
  const int p = W();
  const auto reduction = options.reduction();
  pp::LossFn loss = [reduction](const at::Tensor& out, const at::Tensor& t) { return mse(out, t, reduction); };
  Pipeline pipe;
  const int v = which == Which::Interleaved ? 2 : 1;
  for (int k = 0; k < v; ++k) {
    const int s = k * p + R();
    const int blocks = 2 / v;
    pipe.first_block.push_back(s * blocks);
    pipe.parts.push_back(part_of(whole, s * blocks, blocks));
    pipe.stages.push_back(std::make_unique<pp::Stage>(pipe.parts.back(), s, v * p, shared_pg()));
    pipe.first = pipe.first || pipe.stages.back()->is_first();
    pipe.last = pipe.last || pipe.stages.back()->is_last();
  }
  if (which == Which::GPipe) {
    pipe.schedule = std::make_unique<pp::ScheduleGPipe>(*pipe.stages[0], m, loss, options);
  } else if (which == Which::OneFOneB) {
    pipe.schedule = std::make_unique<pp::Schedule1F1B>(*pipe.stages[0], m, loss, options);
  } else {
    std::vector<pp::Stage*> mine;
    for (auto& stage : pipe.stages) mine.push_back(stage.get());
    pipe.schedule = std::make_unique<pp::ScheduleInterleaved1F1B>(mine, m, loss, options);
  }
  return pipe;
}

// The whole model's gradients as one vector, every block's from the rank that holds it (zeros
// elsewhere, then summed over the ranks: exact, so schedules compare bit for bit).
at::Tensor whole_gradient(const Pipeline& pipe, int blocks) {
  constexpr int64_t kPerBlock = kWidth * kWidth + kWidth;
  at::Tensor flat = at::zeros({blocks * kPerBlock});
  for (size_t k = 0; k < pipe.parts.size(); ++k) {
    int64_t at_ = pipe.first_block[k] * kPerBlock;
    for (const auto& param : pipe.parts[k]->parameters()) {
      flat.narrow(0, at_, param.numel()).copy_(param.grad().reshape(-1));
      at_ += param.numel();
    }
  }
  if (W() > 1) pg().all_reduce(flat, tandem::comm::ReduceOp::Sum);
  return flat;
}

// Three SGD steps of the pipeline (this rank's stages) and of one process on the whole batch; the
// gradients after each step and the weights after the last. Returns the whole model's gradients
// of the first step (to compare the schedules with each other).
at::Tensor train_against_one_process(Which which, int m, int64_t n, at::Reduction::Reduction reduction) {
  const int p = W();
  torch::nn::Sequential whole = whole_model(p);
  Pipeline pipe = make_pipeline(which, whole, m, pp::ScheduleOptions().reduction(reduction));
  std::vector<at::Tensor> theirs;
  for (size_t k = 0; k < pipe.parts.size(); ++k) {
    for (int b = pipe.first_block[k]; b < pipe.first_block[k] + static_cast<int>(pipe.parts[k]->size()) / 2; ++b) {
      for (const auto& param : whole->ptr(static_cast<size_t>(2 * b))->parameters()) theirs.push_back(param);
    }
  }
  const auto mine = pipe.parameters();
  EXPECT_EQ(mine.size(), theirs.size());
  torch::optim::SGD ref_opt(whole->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD opt(mine, torch::optim::SGDOptions(0.1));
  at::Tensor first_grads;
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(n, 50 + static_cast<uint64_t>(step));
    at::Tensor ref_loss = mse(whole->forward(x), y, reduction);
    ref_loss.backward();
    const auto losses = pipe.schedule->step(pipe.first ? x : at::Tensor(), pipe.last ? y : at::Tensor());
    if (pipe.last) {
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
    for (size_t k = 0; k < mine.size(); ++k) {
      if (!mine[k].grad().defined()) {
        ADD_FAILURE() << "step " << step << ", parameter " << k << " has no gradient";
        return {};
      }
      EXPECT_TRUE(close_at_scale(mine[k].grad(), theirs[k].grad(), 1e-5))
          << "step " << step << ", parameter " << k << " on rank " << R();
    }
    if (step == 0) first_grads = whole_gradient(pipe, 2 * p);
    ref_opt.step();
    ref_opt.zero_grad();
    opt.step();
    opt.zero_grad();
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    EXPECT_TRUE(close_at_scale(mine[k], theirs[k], 1e-5)) << "weights after 3 steps, parameter " << k;
  }
  return first_grads;
}

}  // namespace

TEST(Pipeline, EverySchedulesEqualsOneProcessAndTheOthers) {
  for (int m : {W(), 2 * W()}) {
    const auto gpipe = train_against_one_process(Which::GPipe, m, 4 * W(), at::Reduction::Mean);
    const auto one_f_one_b = train_against_one_process(Which::OneFOneB, m, 4 * W(), at::Reduction::Mean);
    const auto interleaved = train_against_one_process(Which::Interleaved, m, 4 * W(), at::Reduction::Mean);
    EXPECT_TRUE(at::equal(gpipe, one_f_one_b)) << "m " << m;
    EXPECT_TRUE(at::equal(gpipe, interleaved)) << "m " << m;
  }
}

TEST(Pipeline, UnevenMicrobatchesWeighTheirLossesBySize) {
  // 2m + 1 samples in m = W + 1 microbatches: the first one sample larger than the others.
  const int m = W() + 1;
  train_against_one_process(Which::OneFOneB, m, 2 * m + 1, at::Reduction::Mean);
  train_against_one_process(Which::GPipe, m, 2 * m + 1, at::Reduction::Mean);
  // Interleaved takes multiples of the processes: 2W microbatches of 2 and 3 samples.
  train_against_one_process(Which::Interleaved, 2 * W(), 5 * W(), at::Reduction::Mean);
}

TEST(Pipeline, ASumReducedLossIsNotScaled) {
  train_against_one_process(Which::OneFOneB, 2 * W(), 4 * W(), at::Reduction::Sum);
  train_against_one_process(Which::Interleaved, 2 * W(), 4 * W(), at::Reduction::Sum);
}

// evaluate(): forwards only, the last stage's outputs of the whole batch equal the whole model's,
// and nothing is left for autograd (no gradient after).
TEST(Pipeline, EvaluateIsTheWholeModelsForward) {
  torch::nn::Sequential whole = whole_model(W());
  auto [x, y] = batch(3 * W() + 1, 31);
  at::Tensor expected;
  {
    at::NoGradGuard no_grad;
    expected = whole->forward(x);
  }
  for (Which which : {Which::GPipe, Which::OneFOneB, Which::Interleaved}) {
    Pipeline pipe = make_pipeline(which, whole, W(), {});
    const at::Tensor out = pipe.schedule->evaluate(pipe.first ? x : at::Tensor());
    if (pipe.last) {
      ASSERT_TRUE(out.defined());
      EXPECT_FALSE(out.requires_grad());
      EXPECT_TRUE(close_at_scale(out, expected, 1e-5));
    } else {
      EXPECT_FALSE(out.defined());
    }
    for (const auto& p : pipe.parameters()) EXPECT_FALSE(p.grad().defined());
  }
}

// The schedules run the orders tests/pp/schedule_order_test.cpp replays.
TEST(Pipeline, SchedulesRunTheirOrders) {
  const int p = W(), m = 2 * W();
  torch::nn::Sequential whole = whole_model(p);
  auto same = [](const std::vector<pp::Action>& a, const std::vector<pp::Action>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const pp::Action& x, const pp::Action& y) {
             return x.kind == y.kind && x.microbatch == y.microbatch && x.stage == y.stage;
           });
  };
  EXPECT_TRUE(same(make_pipeline(Which::GPipe, whole, m, {}).schedule->actions(), pp::gpipe_actions(p, R(), m)));
  EXPECT_TRUE(same(make_pipeline(Which::OneFOneB, whole, m, {}).schedule->actions(), pp::one_f_one_b_actions(p, R(), m)));
  EXPECT_TRUE(
      same(make_pipeline(Which::Interleaved, whole, m, {}).schedule->actions(), pp::interleaved_actions(p, 2, R(), m)));
}

// Note [Step measurements]: a step's time and this process's time blocked on its neighbours, and
// with track_memory the bytes the step held at once: GPipe keeps all m microbatches' activations
// on every stage, 1F1B at most P - s of them on stage s. A, one microbatch's activations, is
// measured here by the same allocator count around a lone forward of the stage.
TEST(Pipeline, StepMeasuresItsTimeAndTheActivationsItHeld) {
  const int p = W(), m = 2 * p;
  const int64_t per_microbatch = 64;
  torch::nn::Sequential whole = whole_model(p);
  auto [x, y] = batch(per_microbatch, 11);
  int64_t one = 0;  // A
  {
    torch::nn::Sequential part = stage_part(whole, R());
    tandem::CpuMemoryTracker tracker(1);
    tandem::CpuMemoryTracker::Scope counting(tracker, 0);
    at::Tensor input = x;
    if (R() > 0) input = input.clone().requires_grad_(true);  // received: a buffer of its own
    at::Tensor output = part->forward(input);
    one = tracker.live(0);
  }
  ASSERT_GT(one, 0);
  // The peak of the second step (the gradients exist then), at m and 2m microbatches of the same size.
  auto peak_of = [&](Which which, int microbatches) {
    auto [xs, ys] = batch(microbatches * per_microbatch, 11);
    Pipeline pipe = make_pipeline(which, whole, microbatches, pp::ScheduleOptions().track_memory(true));
    for (int step = 0; step < 2; ++step) {
      pipe.schedule->step(pipe.first ? xs : at::Tensor(), pipe.last ? ys : at::Tensor());
      for (auto& param : pipe.parameters()) param.mutable_grad().zero_();
    }
    const pp::StepMeasurement& measured = pipe.schedule->last_step();
    EXPECT_GT(measured.seconds, 0);
    EXPECT_GE(measured.blocked_seconds, 0);
    EXPECT_LE(measured.blocked_seconds, measured.seconds);
    EXPECT_TRUE(measured.peak_bytes.has_value());
    return measured.peak_bytes.value_or(0);
  };
  const int64_t gpipe = peak_of(Which::GPipe, m), gpipe_twice = peak_of(Which::GPipe, 2 * m);
  const int64_t one_f_one_b = peak_of(Which::OneFOneB, m), one_f_one_b_twice = peak_of(Which::OneFOneB, 2 * m);
  // GPipe holds one A more per microbatch: at least m A more at 2m. 1F1B the same P - s of them
  // whatever m (what grows is the losses kept, 4 bytes each, on the last stage). Exact because a
  // send's buffer is let go when the receiver has it, by the stage and by the backend (the MPI
  // backend's task used to hold it a moment longer: 3 runs in 20 under MPI differed by a message).
  EXPECT_GE(gpipe_twice - gpipe, m * one) << "A = " << one << " bytes";
  EXPECT_LE(one_f_one_b_twice - one_f_one_b, R() == p - 1 ? 4 * m : 0) << "A = " << one << " bytes";
  EXPECT_GE(gpipe, m * one) << "A = " << one << " bytes";
  EXPECT_GE(one_f_one_b, (p - R()) * one) << "A = " << one << " bytes";
  EXPECT_LT(one_f_one_b, gpipe);
  std::fprintf(stderr, "rank %d: A %lld, GPipe %lld / %lld, 1F1B %lld / %lld bytes at m = %d / %d\n", R(),
               (long long)one, (long long)gpipe, (long long)gpipe_twice, (long long)one_f_one_b,
               (long long)one_f_one_b_twice, m, 2 * m);
  // Without track_memory nothing is counted.
  Pipeline plain = make_pipeline(Which::OneFOneB, whole, m, {});
  auto [xs, ys] = batch(m * per_microbatch, 12);
  plain.schedule->step(plain.first ? xs : at::Tensor(), plain.last ? ys : at::Tensor());
  EXPECT_FALSE(plain.schedule->last_step().peak_bytes.has_value());
}

// PP x DDP and PP x FSDP on a 2-D mesh, dp x pp = W/2 x 2: every pipeline trains its share of
// the batch, each stage's module a DDP replica (or FSDP shard) over mesh["dp"]. After each step
// the weights equal one process's on the whole batch, for every schedule; the data-parallel group
// reduces once per step (DDP: one all-reduce per instance, its one bucket; FSDP: one
// reduce-scatter per unit), not once per microbatch.
enum class Replica { Ddp, Fsdp };

void pipeline_times_data_parallel(Replica replica) {
  if (W() < 2 || W() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const int stages_pp = 2, dp = W() / 2;
  tandem::comm::DeviceMesh mesh(shared_pg(), {dp, stages_pp}, {"dp", "pp"});
  const auto pp_group = mesh.group("pp"), dp_group = mesh.group("dp");
  const int r = pp_group->rank(), d = dp_group->rank();
  const int m = 2 * stages_pp;
  for (Which which : {Which::GPipe, Which::OneFOneB, Which::Interleaved}) {
    SCOPED_TRACE(which == Which::GPipe ? "GPipe" : which == Which::OneFOneB ? "1F1B" : "interleaved");
    torch::nn::Sequential whole = whole_model(stages_pp);
    const int v = which == Which::Interleaved ? 2 : 1, blocks = 2 / v;
    std::vector<torch::nn::Sequential> parts;
    std::vector<int> first_block;
    std::vector<std::unique_ptr<pp::Stage>> stages;
    std::vector<tandem::fsdp::FullyShardedDataParallel<torch::nn::Sequential>> sharded;
    std::vector<at::Tensor> trained;  // what the optimizer steps
    for (int k = 0; k < v; ++k) {
      const int s = k * stages_pp + r;
      parts.push_back(part_of(whole, s * blocks, blocks));
      first_block.push_back(s * blocks);
      if (replica == Replica::Ddp) {
        tandem::ddp::DistributedDataParallel wrapped(parts.back(), dp_group);
        stages.push_back(std::make_unique<pp::Stage>(wrapped, s, v * stages_pp, pp_group));
        for (const auto& param : parts.back()->parameters()) trained.push_back(param);
      } else {
        sharded.emplace_back(parts.back(), dp_group);
        stages.push_back(std::make_unique<pp::Stage>(sharded.back(), s, v * stages_pp, pp_group));
        for (const auto& shard : sharded.back()->shard_parameters()) trained.push_back(shard);
      }
    }
    pp::LossFn loss = [](const at::Tensor& out, const at::Tensor& t) { return at::mse_loss(out, t); };
    std::unique_ptr<pp::Schedule> schedule;
    if (which == Which::GPipe) schedule = std::make_unique<pp::ScheduleGPipe>(*stages[0], m, loss);
    if (which == Which::OneFOneB) schedule = std::make_unique<pp::Schedule1F1B>(*stages[0], m, loss);
    if (which == Which::Interleaved) {
      schedule = std::make_unique<pp::ScheduleInterleaved1F1B>(std::vector<pp::Stage*>{stages[0].get(), stages[1].get()},
                                                               m, loss);
    }
    // The reference's parameters of this rank's blocks, in the parts' order.
    std::vector<at::Tensor> theirs;
    for (size_t k = 0; k < parts.size(); ++k) {
      for (int b = first_block[k]; b < first_block[k] + blocks; ++b) {
        for (const auto& param : whole->ptr(static_cast<size_t>(2 * b))->parameters()) theirs.push_back(param);
      }
    }
    auto gathers = [&] {
      int64_t n = 0;
      for (auto& f : sharded) {
        for (const auto& unit : f->units()) n += unit.gathers;
      }
      return n;
    };
    size_t units = 0;
    for (auto& f : sharded) units += f->units().size();
    torch::optim::SGD ref_opt(whole->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD opt(trained, torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = batch(4 * m * dp, 70 + static_cast<uint64_t>(step));
      mse(whole->forward(x), y, at::Reduction::Mean).backward();
      const auto before = dp_group->traffic();
      const int64_t gathers_before = gathers();
      const bool first = r == 0, last = r == stages_pp - 1;
      schedule->step(first ? x.chunk(dp)[d] : at::Tensor(), last ? y.chunk(dp)[d] : at::Tensor());
      const uint64_t collectives = dp_group->traffic().collectives - before.collectives;
      if (step == 2 && dp > 1) {
        if (replica == Replica::Ddp) {
          EXPECT_EQ(collectives, static_cast<uint64_t>(v)) << "all-reduces of the step";
        } else {
          EXPECT_EQ(collectives - static_cast<uint64_t>(gathers() - gathers_before), units) << "reduce-scatters of the step";
        }
      }
      ref_opt.step();
      ref_opt.zero_grad();
      opt.step();
      opt.zero_grad();
      // This rank's blocks, whole, against the reference's after the same step.
      std::vector<at::Tensor> mine;
      if (replica == Replica::Ddp) {
        for (const auto& part : parts) {
          for (const auto& param : part->parameters()) mine.push_back(param);
        }
      } else {
        for (auto& f : sharded) {
          for (auto& [name, whole_param] : f->gather_parameters()) mine.push_back(whole_param);
        }
      }
      ASSERT_EQ(mine.size(), theirs.size());
      for (size_t k = 0; k < mine.size(); ++k) {
        EXPECT_TRUE(close_at_scale(mine[k], theirs[k], 1e-5))
            << "after step " << step << ", parameter " << k << " on rank " << R();
      }
    }
  }
}

TEST(PipelineDataParallel, PpTimesDdpEqualsOneProcessOnTheWholeBatch) { pipeline_times_data_parallel(Replica::Ddp); }

TEST(PipelineDataParallel, PpTimesFsdpEqualsOneProcessOnTheWholeBatch) { pipeline_times_data_parallel(Replica::Fsdp); }

// The Accelerator with pp_size: the same training loop as one process's, the model cut into
// stages (one per process, or two under interleaved 1F1B), DDP or FSDP over what pp_size leaves,
// gradients clipped over every stage's parameters (to half the reference's norm, so the clip
// bites). The weights after each step equal one process's on the whole batch. At 1 process the
// same loop runs with pp_size 1.
void accelerator_pipeline(tandem::Strategy strategy, tandem::PipelineSchedule kind) {
  const int P = W() >= 2 ? 2 : 1;
  tandem::Accelerator acc(shared_pg(), tandem::AcceleratorOptions().strategy(strategy).progress(false).parallelism(
                                           tandem::ParallelismConfig().pp_size(P)));
  const int v = kind == tandem::PipelineSchedule::Interleaved1F1B ? 2 : 1, blocks = 2 / v;
  torch::nn::Sequential whole = whole_model(P);
  std::vector<torch::nn::Sequential> parts;
  std::vector<int> first_block;
  for (int s : acc.pipeline_stages(v * P)) {
    parts.push_back(part_of(whole, s * blocks, blocks));
    first_block.push_back(s * blocks);
  }
  const int dp = acc.data_parallel_size(), m = 2 * P;
  auto pipe = acc.prepare_pipeline(parts, [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); },
                                   tandem::PipelineOptions().schedule(kind).microbatches(m));
  torch::optim::SGD opt(pipe.parameters(), torch::optim::SGDOptions(0.1));
  acc.prepare_optimizer(opt);
  torch::optim::SGD ref_opt(whole->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(4 * m * dp, 90 + static_cast<uint64_t>(step));
    mse(whole->forward(x), y, at::Reduction::Mean).backward();
    const double ref_norm = torch::nn::utils::clip_grad_norm_(whole->parameters(), 1e9);
    torch::nn::utils::clip_grad_norm_(whole->parameters(), ref_norm / 2);
    ref_opt.step();
    ref_opt.zero_grad();
    const auto mine_x = x.chunk(dp)[acc.data_parallel_rank()], mine_y = y.chunk(dp)[acc.data_parallel_rank()];
    const auto losses = pipe.step(pipe.is_first() ? mine_x : at::Tensor(), pipe.is_last() ? mine_y : at::Tensor());
    EXPECT_EQ(losses.size(), pipe.is_last() ? static_cast<size_t>(m) : 0u);
    const double norm = acc.clip_grad_norm(pipe.parameters(), ref_norm / 2);
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm) << "step " << step;
    acc.step(opt);
    acc.zero_grad(opt);
    for (size_t k = 0; k < parts.size(); ++k) {
      std::vector<at::Tensor> mine, theirs;
      if (strategy == tandem::Strategy::Fsdp) {
        for (auto& [name, param] : pipe.models()[k]->fsdp()->gather_parameters()) mine.push_back(param);
      } else {
        mine = parts[k]->parameters();
      }
      for (int b = first_block[k]; b < first_block[k] + blocks; ++b) {
        for (const auto& param : whole->ptr(static_cast<size_t>(2 * b))->parameters()) theirs.push_back(param);
      }
      ASSERT_EQ(mine.size(), theirs.size());
      for (size_t i = 0; i < mine.size(); ++i) {
        EXPECT_TRUE(close_at_scale(mine[i], theirs[i], 1e-5))
            << "after step " << step << ", stage part " << k << ", parameter " << i << " on rank " << R();
      }
    }
  }
}

// Note [Seeds per stage]: the stages build the same whole model (the same draws before
// prepare_pipeline), then each draws its own (Megatron's seed per stage, tandem/tp/random.h).
TEST(AcceleratorPipeline, StagesDrawTheirOwnNumbersFromPreparePipelineOn) {
  if (W() < 2) GTEST_SKIP() << "needs two stages";
  tandem::Accelerator acc(shared_pg(), tandem::AcceleratorOptions().seed(11).progress(false).parallelism(
                                           tandem::ParallelismConfig().pp_size(2)));
  const at::Tensor before = at::rand({4});
  torch::nn::Sequential whole = whole_model(2);
  auto pipe = acc.prepare_pipeline(std::vector<torch::nn::Sequential>{part_of(whole, acc.pipeline_rank(), 1)},
                                   [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); });
  const at::Tensor after = at::rand({4});
  torch::manual_seed(tandem::tp::default_seed(11, acc.parallel_ranks()));
  EXPECT_TRUE(at::equal(after, at::rand({4}))) << "the stage's seed";
  const auto befores = shared_pg()->all_gather(before), afters = shared_pg()->all_gather(after);
  const int other = acc.pipeline_rank() == 0 ? R() + W() / 2 : R() - W() / 2;  // the same dp rank, the other stage
  EXPECT_TRUE(at::equal(befores[static_cast<size_t>(other)], before)) << "the stages built the model from one stream";
  EXPECT_FALSE(at::equal(afters[static_cast<size_t>(other)], after)) << "the stages draw apart";
}

TEST(AcceleratorPipeline, DdpAndOneFOneBTrainAsOneProcess) {
  accelerator_pipeline(tandem::Strategy::Ddp, tandem::PipelineSchedule::OneFOneB);
}

TEST(AcceleratorPipeline, FsdpAndGPipeTrainAsOneProcess) {
  accelerator_pipeline(tandem::Strategy::Fsdp, tandem::PipelineSchedule::GPipe);
}

TEST(AcceleratorPipeline, DdpAndInterleavedTrainAsOneProcess) {
  accelerator_pipeline(tandem::Strategy::Ddp, tandem::PipelineSchedule::Interleaved1F1B);
}

TEST(AcceleratorPipeline, WhatItCannotComposeIsAOneLineError) {
  const int P = W() >= 2 ? 2 : 1;
  auto loss = [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); };
  auto config = tandem::ParallelismConfig().pp_size(P);
  torch::nn::Sequential whole = whole_model(P);
  {
    tandem::Accelerator acc(shared_pg(), tandem::AcceleratorOptions().progress(false).parallelism(config));
    EXPECT_ERROR(acc.prepare_pipeline(std::vector<torch::nn::Sequential>{}, loss),
                 "prepare_pipeline: no stage given (this process's parts of the model)");
    EXPECT_ERROR(acc.prepare_pipeline(std::vector<torch::nn::Sequential>{part_of(whole, 0, 1), part_of(whole, 1, 1)}, loss),
                 "prepare_pipeline: 2 stages on this process: only PipelineSchedule::Interleaved1F1B runs several per "
                 "process");
    if (P > 1) {
      // Refused before any stage is prepared: the pipeline group gets no stage to agree on.
      EXPECT_ERROR(acc.prepare_pipeline(std::vector<torch::nn::Sequential>{part_of(whole, 0, 1)}, loss,
                                        tandem::PipelineOptions().microbatches(P - 1)),
                   "prepare_pipeline: " + std::to_string(P - 1) + " microbatches over pp_size " + std::to_string(P) +
                       ": a pipeline needs at least as many microbatches as processes to fill");
      EXPECT_ERROR(acc.prepare_pipeline(std::vector<torch::nn::Sequential>{part_of(whole, 0, 1), part_of(whole, 1, 1)},
                                        loss,
                                        tandem::PipelineOptions()
                                            .schedule(tandem::PipelineSchedule::Interleaved1F1B)
                                            .microbatches(P + 1)),
                   "prepare_pipeline: interleaved 1F1B with " + std::to_string(P + 1) + " microbatches over pp_size " +
                       std::to_string(P) + ": the microbatches must be a multiple of the processes");
      EXPECT_ERROR(acc.pipeline_stages(P + 1), "pipeline_stages: " + std::to_string(P + 1) + " stages over pp_size " +
                                                   std::to_string(P) + ": each process holds the same number of stages");
    }
  }
  {
    // A pipeline and a model prepared apart: one checkpoint of both is refused, before any file.
    tandem::Accelerator acc(shared_pg(), tandem::AcceleratorOptions().progress(false).parallelism(config));
    auto pipe = acc.prepare_pipeline(std::vector<torch::nn::Sequential>{part_of(whole, 2 * acc.pipeline_rank(), 2)}, loss);
    auto apart = acc.prepare_model(part_of(whole, 0, 1));
    EXPECT_ERROR(acc.save_state(tandem::test::shared_temp_folder("tandem-pp-mixed")),
                 "checkpoints: a pipeline's stages and models prepared apart in one checkpoint are not built yet; "
                 "prepare every model as a stage of the pipeline");
  }
  // Refused from the options alone: at construction under pp_size > 1 (before anything is
  // prepared), by prepare_pipeline at pp_size 1.
  auto expect_refused = [&](tandem::AcceleratorOptions options, const std::string& why) {
    options.progress(false).parallelism(config);
    if (P > 1) {
      EXPECT_ERROR(tandem::Accelerator(shared_pg(), options), "Accelerator: pp_size " + std::to_string(P) + ": " + why);
      return;
    }
    tandem::Accelerator acc(shared_pg(), options);
    EXPECT_ERROR(acc.prepare_pipeline(std::vector<torch::nn::Sequential>{part_of(whole, 0, 1)}, loss),
                 "prepare_pipeline: " + why);
  };
  expect_refused(tandem::AcceleratorOptions().mixed_precision(tandem::Precision::Fp16),
                 "fp16 under a pipeline is not built yet (its loss scale would have to reach every stage's backward); "
                 "use Precision::Bf16");
  expect_refused(tandem::AcceleratorOptions().gradient_accumulation_steps(2),
                 "gradient_accumulation_steps 2: a pipeline step accumulates its microbatches already; raise "
                 "PipelineOptions::microbatches instead");
  expect_refused(tandem::AcceleratorOptions().zero_stage(1),
                 "zero_stage 1 over pipeline stages is not built yet; use Strategy::Fsdp (it shards each stage) or "
                 "zero_stage 0");
}

namespace {

// Blocks [first, first + count) of whole_model's 2P, under the whole model's names ("block3.weight"
// on whichever stage holds block 3): what a pipeline checkpoint needs (Note [Pipeline checkpoints]).
struct NamedBlocksImpl : torch::nn::Module {
  NamedBlocksImpl(const torch::nn::Sequential& whole, int first, int count) {
    for (int b = first; b < first + count; ++b) {
      layers.push_back(register_module("block" + std::to_string(b), copy_of_block(whole, b)));
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& layer : layers) x = at::tanh(layer(x));
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(NamedBlocks);

// Every parameter this rank holds, whole, by name ("block3.weight").
std::map<std::string, at::Tensor> weights_by_name(tandem::Accelerator& acc, std::vector<tandem::PreparedModel<NamedBlocks>>& models) {
  std::map<std::string, at::Tensor> out;
  for (auto& model : models) {
    if (acc.strategy() == tandem::Strategy::Fsdp) {
      for (auto& [name, param] : model->fsdp()->gather_parameters()) out[name] = param.clone();
    } else {
      for (const auto& item : model->module()->named_parameters()) out[item.key()] = item.value().detach().clone();
    }
  }
  return out;
}

// One AdamW step of `models` on the global batch of the step (this rank's data-parallel share;
// the step counted from the checkpoint's when one was loaded).
void train_step(tandem::Accelerator& acc, torch::optim::Optimizer& opt, std::vector<tandem::PreparedModel<NamedBlocks>>& models,
                tandem::PreparedPipeline<NamedBlocks>* pipe) {
  const int dp = acc.data_parallel_size(), d = acc.data_parallel_rank();
  auto [x, y] = batch(64, 200 + static_cast<uint64_t>(acc.completed_steps()));
  const at::Tensor mine_x = x.chunk(dp)[d], mine_y = y.chunk(dp)[d];
  if (pipe) {
    pipe->step(pipe->is_first() ? mine_x : at::Tensor(), pipe->is_last() ? mine_y : at::Tensor());
  } else {
    acc.backward(at::mse_loss(models.front()->forward(mine_x), mine_y));
  }
  acc.step(opt);
  acc.zero_grad(opt);
}

// A run of the 2P-block model: as a pipeline of `pp` stages (0: no pipeline), trained `steps`
// steps (from `resume` if given, then one more), saving after them into `dir` when given.
struct Run {
  std::map<std::string, at::Tensor> at_save, after;  // the weights this rank holds
  std::map<std::string, at::Tensor> state_dict;      // get_state_dict at the save, on every process
  std::string saved;
};

Run run_named(tandem::Strategy strategy, int pp, int steps, const std::string& resume, const std::string& dir) {
  const int P = W() >= 2 ? 2 : 1;
  torch::nn::Sequential whole = whole_model(P);
  tandem::Accelerator acc(shared_pg(), tandem::AcceleratorOptions().strategy(strategy).progress(false).parallelism(
                                           tandem::ParallelismConfig().pp_size(std::max(pp, 1))));
  std::vector<tandem::PreparedModel<NamedBlocks>> models;
  std::optional<tandem::PreparedPipeline<NamedBlocks>> pipe;
  if (pp > 0) {
    const int per_stage = 2 * P / pp;
    std::vector<NamedBlocks> stages;
    for (int s : acc.pipeline_stages(pp)) stages.emplace_back(whole, s * per_stage, per_stage);
    pipe.emplace(acc.prepare_pipeline(stages, [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); },
                                      tandem::PipelineOptions().microbatches(2 * pp)));
    models = pipe->models();
  } else {
    models.push_back(acc.prepare_model(NamedBlocks(whole, 0, 2 * P)));
  }
  std::vector<at::Tensor> params;
  for (auto& model : models) {
    for (const auto& p : model->parameters()) params.push_back(p);
  }
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(0.01));
  acc.prepare_optimizer(opt);
  Run run;
  if (!resume.empty()) acc.load_state(resume);
  for (int step = 0; step < steps; ++step) train_step(acc, opt, models, pipe ? &*pipe : nullptr);
  run.at_save = weights_by_name(acc, models);
  for (auto& [name, t] : acc.get_state_dict(models.front(), /*on_every_process=*/true)) run.state_dict[name] = t;
  if (!dir.empty()) run.saved = acc.save_state(dir);
  train_step(acc, opt, models, pipe ? &*pipe : nullptr);
  run.after = weights_by_name(acc, models);
  return run;
}

// Every tensor of `mine` (a pipeline's stages on this rank) against `theirs` (the whole model's).
void expect_same_weights(const std::map<std::string, at::Tensor>& mine, const std::map<std::string, at::Tensor>& theirs,
                         const std::string& what) {
  EXPECT_FALSE(mine.empty()) << what;
  for (const auto& [name, tensor] : mine) {
    auto it = theirs.find(name);
    if (it == theirs.end()) {
      ADD_FAILURE() << what << ": '" << name << "' is not the whole model's";
      continue;
    }
    EXPECT_TRUE(close_at_scale(tensor, it->second, 1e-5)) << what << ": '" << name << "' on rank " << R();
  }
}

void pipeline_checkpoint(tandem::Strategy strategy) {
  if (W() < 2) GTEST_SKIP() << "needs a pipeline of two processes";
  const std::string dir = tandem::test::shared_temp_folder("tandem-pp-ckpt");
  // Two steps as a pipeline of 2 stages, saved; then a third.
  const Run piped = run_named(strategy, 2, 2, "", dir);
  // Loaded without a pipeline (the whole model on every process): the weights at the save, and
  // after the same third step (AdamW's moments came back too).
  const Run whole = run_named(strategy, 0, 0, piped.saved, "");
  expect_same_weights(piped.at_save, whole.at_save, "loaded without a pipeline");
  expect_same_weights(piped.after, whole.after, "a step after loading without a pipeline");
  EXPECT_EQ(whole.at_save.size(), 8u);  // the 4 blocks' weights and biases
  // get_state_dict of a pipeline: every stage's tensors, whole, on every process.
  EXPECT_EQ(piped.state_dict.size(), 8u);
  expect_same_weights(piped.state_dict, whole.at_save, "get_state_dict of the pipeline");
  expect_same_weights(whole.state_dict, whole.at_save, "get_state_dict without a pipeline");
  // At another pipeline size: W stages of 2P / W blocks.
  if (W() == 4) {
    const Run four = run_named(strategy, 4, 0, piped.saved, "");
    EXPECT_EQ(four.at_save.size(), 2u);  // one block
    expect_same_weights(four.at_save, whole.at_save, "loaded as a pipeline of 4");
    expect_same_weights(four.after, whole.after, "a step after loading as a pipeline of 4");
  }
  // The reverse: the whole model's checkpoint into a pipeline of 2.
  const Run whole_saved = run_named(strategy, 0, 1, "", tandem::test::shared_temp_folder("tandem-pp-ckpt-whole"));
  const Run piped_again = run_named(strategy, 2, 0, whole_saved.saved, "");
  expect_same_weights(piped_again.at_save, whole_saved.at_save, "a whole model's checkpoint loaded as a pipeline");
  expect_same_weights(piped_again.after, whole_saved.after, "a step after that");
}

}  // namespace

TEST(AcceleratorPipeline, DdpCheckpointsLoadAtAnotherPipelineSize) { pipeline_checkpoint(tandem::Strategy::Ddp); }

TEST(AcceleratorPipeline, FsdpCheckpointsLoadAtAnotherPipelineSize) { pipeline_checkpoint(tandem::Strategy::Fsdp); }

// PP on CUDA (scripts/gpu-check: at world 1, and as two ranks sharing one GPU, where NCCL has
// only rank 0 and every stage's messages go over Gloo, Note in tandem/pp/stage.h): each stage's
// module on a GPU, one 1F1B step leaves the gradients of the whole model on one process (on the
// CPU), to the tolerance of another device's arithmetic.
TEST(PipelineGpu, OneFOneBOnCudaEqualsTheWholeModel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const int p = W();
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(pg().world().local_rank % gpus));
  torch::nn::Sequential whole = whole_model(p);
  torch::nn::Sequential part = stage_part(whole, R());
  part->to(device);
  pp::Stage stage(part, R(), p, shared_pg());
  EXPECT_EQ(stage.message_device().is_cuda(), pg().has_nccl() && p <= gpus) << "messages over NCCL only if all can";
  pp::Schedule1F1B schedule(stage, 2 * p, [](const at::Tensor& out, const at::Tensor& t) { return at::mse_loss(out, t); });
  auto [x, y] = batch(4 * p, 21);
  schedule.step(stage.is_first() ? x.to(device) : at::Tensor(), stage.is_last() ? y.to(device) : at::Tensor());
  at::mse_loss(whole->forward(x), y).backward();
  std::vector<at::Tensor> theirs;
  for (int b = 2 * R(); b < 2 * R() + 2; ++b) {
    for (const auto& param : whole->ptr(static_cast<size_t>(2 * b))->parameters()) theirs.push_back(param);
  }
  const auto mine = part->parameters();
  ASSERT_EQ(mine.size(), theirs.size());
  for (size_t k = 0; k < mine.size(); ++k) {
    ASSERT_TRUE(mine[k].grad().defined()) << k;
    EXPECT_TRUE(close_at_scale(mine[k].grad().cpu(), theirs[k].grad(), 1e-4)) << k;
  }
}

// Agreement before waiting: stages and schedules that differ between processes stop every process
// at once with one line naming the field, each value and its ranks (not a timeout, not a shape
// error on one of them).
TEST(PipelineErrors, DisagreementsBetweenProcessesAreOneLineOnEveryOne) {
  const int p = W();
  if (p < 2) GTEST_SKIP() << "needs two processes";
  std::string others = p == 2 ? "rank 1" : "ranks 1";
  for (int r = 2; r < p; ++r) others += ", " + std::to_string(r);
  torch::nn::Sequential part = stage_part(whole_model(p), R());
  const auto loss = [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); };
  EXPECT_ERROR(pp::Stage(part, R(), R() == 0 ? p : 2 * p, shared_pg()),
               "pp: the stages being made: the ranks of the world group disagree on number of stages: " +
                   std::to_string(p) + " on rank 0; " + std::to_string(2 * p) + " on " + others);
  pp::Stage stage(part, R(), p, shared_pg());
  EXPECT_ERROR(pp::Schedule1F1B(stage, R() == 0 ? p : 2 * p, loss),
               "pp: the schedule: the ranks of the world group disagree on microbatches: " + std::to_string(p) +
                   " on rank 0; " + std::to_string(2 * p) + " on " + others);
  auto make = [&]() -> std::unique_ptr<pp::Schedule> {
    if (R() == 0) return std::make_unique<pp::ScheduleGPipe>(stage, p, loss);
    return std::make_unique<pp::Schedule1F1B>(stage, p, loss);
  };
  EXPECT_ERROR(make(), "pp: the schedule: the ranks of the world group disagree on kind: GPipe on rank 0; 1F1B on " +
                           others);
}

TEST(PipelineErrors, BadMicrobatchCountsBatchesAndPlacementsAreOneLineErrors) {
  const int p = W();
  torch::nn::Sequential part = stage_part(whole_model(p), R());
  pp::Stage stage(part, R(), p, shared_pg());
  const auto loss = [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); };
  if (p > 1) {
    EXPECT_ERROR(pp::Schedule1F1B(stage, p - 1, loss),
                 "pp: 1F1B with " + std::to_string(p - 1) + " microbatches over " + std::to_string(p) +
                     " processes: a pipeline needs at least as many microbatches as processes to fill");
  }
  // A batch smaller than the microbatches: refused on every stage (they agree on the batch size
  // first), before any message; the middle stages, which do not read it, too.
  pp::ScheduleGPipe schedule(stage, 2 * p, loss);
  auto [x, y] = batch(2 * p - 1, 7);
  EXPECT_ERROR(schedule.step(stage.is_first() ? x : at::Tensor(), stage.is_last() ? y : at::Tensor()),
               "pp: a batch of " + std::to_string(2 * p - 1) + " in " + std::to_string(2 * p) +
                   " microbatches: each needs at least one sample");
  // Inputs and targets of different sizes: every stage names both.
  if (p > 1) {
    auto [x8, y8] = batch(2 * p + 2, 8);
    EXPECT_ERROR(schedule.step(stage.is_first() ? x8 : at::Tensor(), stage.is_last() ? y : at::Tensor()),
                 "pp: the first stage (rank 0) has a batch of " + std::to_string(2 * p + 2) + " samples and the last "
                 "(rank " + std::to_string(p - 1) + ") " + std::to_string(2 * p - 1) + " targets");
  }
  EXPECT_ERROR(pp::Stage(part, 2 * p, 2 * p, shared_pg()),
               "pp: stage " + std::to_string(2 * p) + " of " + std::to_string(2 * p) +
                   " does not exist (stages are numbered 0 to " + std::to_string(2 * p - 1) + ")");
  if (p > 1) {
    EXPECT_ERROR(pp::Stage(part, R(), 2 * p + 1, shared_pg()),
                 "pp: " + std::to_string(2 * p + 1) + " stages do not divide among the " + std::to_string(p) +
                     " processes of the pipeline group (each process holds the same number of stages)");
    const int other = (R() + 1) % p;
    EXPECT_ERROR(pp::Stage(part, other, p, shared_pg()),
                 "pp: stage " + std::to_string(other) + " runs on rank " + std::to_string(other) +
                     " of its pipeline group (" + std::to_string(other) + " mod " + std::to_string(p) +
                     "), but this process is rank " + std::to_string(R()));
  }
  // Two stages per process: the one-stage schedules refuse them; interleaved wants both, and a
  // multiple of the processes as microbatches.
  torch::nn::Sequential second = stage_part(whole_model(p), R());
  pp::Stage a(part, R(), 2 * p, shared_pg()), b(second, R() + p, 2 * p, shared_pg());
  EXPECT_ERROR(pp::ScheduleGPipe(a, 2 * p, loss),
               "pp: GPipe runs one stage per process, and this pipeline has " + std::to_string(2 * p) + " stages over " +
                   std::to_string(p) + " processes: use ScheduleInterleaved1F1B");
  EXPECT_ERROR(pp::ScheduleInterleaved1F1B({&b}, 2 * p, loss),
               "pp: interleaved 1F1B runs every stage this process holds (" + std::to_string(R()) + ", " +
                   std::to_string(R() + p) + " of " + std::to_string(2 * p) + "); it was given " +
                   std::to_string(R() + p));
  EXPECT_ERROR(pp::ScheduleInterleaved1F1B({&a, &b, &a}, 2 * p, loss),
               "pp: interleaved 1F1B runs every stage this process holds (" + std::to_string(R()) + ", " +
                   std::to_string(R() + p) + " of " + std::to_string(2 * p) + "); it was given " + std::to_string(R()) +
                   ", " + std::to_string(R()) + ", " + std::to_string(R() + p));
  if (p > 1) {
    EXPECT_ERROR(pp::ScheduleInterleaved1F1B({&b, &a}, p + 1, loss),
                 "pp: interleaved 1F1B with " + std::to_string(p + 1) + " microbatches over " + std::to_string(p) +
                     " processes: the microbatches must be a multiple of the processes (they go through each stage " +
                     std::to_string(p) + " at a time)");
  }
  pp::ScheduleInterleaved1F1B given_in_any_order({&b, &a}, 2 * p, loss);
  EXPECT_EQ(given_in_any_order.actions().front().stage, R());
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

// Stage `failing` fails in the forward of microbatch `fail_at`; the others train normally. The
// job must end with that stage named, never hang: a stage blocked in a receive from it is stopped
// by the launcher when its process exits.
int run_failing_pipeline(int failing, int fail_at, bool kill) {
  Failing part(R() == failing ? fail_at : -1, kill);
  pp::Stage stage(part, R(), W(), shared_pg());
  pp::Schedule1F1B schedule(stage, 2 * W(), [](const at::Tensor& o, const at::Tensor& t) { return at::mse_loss(o, t); });
  auto [x, y] = batch(4 * W(), 9);
  schedule.step(x, y);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::test::Scenarios scenarios;
  scenarios["stage-1-raises"] = [] { return run_failing_pipeline(1, 2, false); };
  scenarios["stage-1-raises-at-once"] = [] { return run_failing_pipeline(1, 0, false); };
  scenarios["stage-2-killed"] = [] { return run_failing_pipeline(2, 2, true); };
  return tandem::test::distributed_test_main(argc, argv, scenarios);
}
