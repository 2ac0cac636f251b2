// The Accelerator with zero_stage(1) against the same loop with zero_stage(0): AdamW with two
// param groups, clip_grad_norm every step, gradient accumulation, fp16 with a skipped step, and a
// checkpoint resumed sharded and whole. Part of accelerator_test (a world of one, 2 and 4
// ranks) and run alone at 3 ranks on Gloo and 2 on MPI (accelerate.zero.*).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "support/compare.h"
#include "support/distributed_main.h"
#include "support/errors.h"
#include "accelerate/two_group_adamw.h"
#include "tandem/accelerate/accelerator.h"

using namespace tandem;

namespace {

using test::zero_net;  // layer sizes that divide no world size; 9 batches of 4 per rank an epoch

struct Outcome {
  std::vector<at::Tensor> params;
  std::vector<double> norms;
  std::vector<bool> skipped;
};

struct Loop {
  int zero_stage = 0;
  bool fsdp = false;            // Strategy::Fsdp (ZeRO-3) instead
  int shard_size = 0;           // with fsdp: ParallelismConfig's (HSDP below the process count)
  int replicate_size = 0;       // ParallelismConfig's
  std::optional<at::ScalarType> fsdp_param_dtype;  // FSDP's policy: gather and compute in it
  int accumulation = 1;
  Precision precision = Precision::No;
  int batches = 12;
  int inf_at = -1;              // this batch's loss is inf on the last rank
  std::string save_to;          // save_state after `save_after` batches, into this folder
  int save_after = -1;
  std::string resume_from;      // load_state first
  bool adagrad = false;         // Adagrad (state from its construction) instead of AdamW
  bool clip_first_layer = false;  // clip_grad_norm over the first Linear's parameters only
  bool two_optimizers = false;    // the two param groups in two AdamW optimizers, clipped together
  double max_norm = 0.5;
};

Outcome train(const Loop& l) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions()
                                         .seed(3)
                                         .progress(false)
                                         .zero_stage(l.zero_stage)
                                         .strategy(l.fsdp ? Strategy::Fsdp : Strategy::Auto)
                                         .fsdp(fsdp::FullyShardOptions().mixed_precision(
                                             fsdp::MixedPrecisionPolicy().param_dtype(l.fsdp_param_dtype)))
                                         .parallelism(ParallelismConfig().shard_size(l.shard_size).replicate_size(
                                             l.replicate_size))
                                         .gradient_accumulation_steps(l.accumulation)
                                         .mixed_precision(l.precision)
                                         .scaler(amp::GradScalerOptions().init_scale(256)));
  torch::manual_seed(3);
  auto net = zero_net();
  const std::vector<at::Tensor> clipped = l.clip_first_layer ? net[0]->parameters() : net->parameters();
  auto model = acc.prepare_model(net);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (l.adagrad) {
    optimizer = std::make_unique<torch::optim::Adagrad>(net->parameters(),
                                                        torch::optim::AdagradOptions(5e-2).initial_accumulator_value(0.1));
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(test::two_group_adamw(*net), torch::optim::AdamWOptions(1e-2));
  }
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;
  if (l.two_optimizers) {
    for (auto& group : test::two_group_adamw(*net)) {
      std::vector<torch::optim::OptimizerParamGroup> one;
      one.push_back(std::move(group));
      optimizers.push_back(std::make_unique<torch::optim::AdamW>(std::move(one), torch::optim::AdamWOptions(1e-2)));
    }
  } else {
    optimizers.push_back(std::move(optimizer));
  }
  for (auto& o : optimizers) acc.prepare_optimizer(*o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  const int64_t n = 36 * test::pg().size();
  auto loader = acc.prepare_data(at::randn({n, 9}, gen), at::randn({n, 5}, gen), 4);
  if (!l.resume_from.empty()) acc.load_state(l.resume_from);
  Outcome run;
  int b = 0;
  while (b < l.batches) {
    for (auto& batch : loader) {
      if (b == l.batches) break;
      if (!l.resume_from.empty() && b < l.save_after) {  // the resumed run starts where the save was
        b = l.save_after;
      }
      auto sync = acc.accumulate(model);
      at::Tensor loss = (model->forward(batch.data).to(at::kFloat) - batch.target).pow(2).mean();
      if (b == l.inf_at && test::pg().rank() == test::pg().size() - 1) loss = loss * std::numeric_limits<float>::infinity();
      acc.backward(loss);
      if (acc.sync_gradients()) run.norms.push_back(acc.clip_grad_norm(clipped, l.max_norm));
      for (auto& o : optimizers) acc.step(*o);
      if (acc.sync_gradients()) run.skipped.push_back(acc.optimizer_step_was_skipped());
      for (auto& o : optimizers) acc.zero_grad(*o);
      ++b;
      if (b == l.save_after && !l.save_to.empty()) acc.save_state(l.save_to);
    }
  }
  if (model->is_fsdp()) {  // the module's parameters hold no data between steps: gather them
    for (auto& [name, p] : model->fsdp()->gather_parameters()) run.params.push_back(p);
  } else {
    for (const auto& p : net->parameters()) run.params.push_back(p.detach().clone());
  }
  return run;
}

void expect_same_norms(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;  // torch's computation, bit for bit
}

}  // namespace

TEST(AcceleratorZero, Stage1EqualsStage0WithClippingAndTwoParamGroups) {
  Loop whole, sharded;
  sharded.zero_stage = 1;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), 0.0) << "bit for bit";
  expect_same_norms(b.norms, a.norms);  // the global norm over shards, the same on every rank
  EXPECT_GT(a.norms.front(), 0.5) << "the clip must act for the test to mean something";
}

TEST(AcceleratorZero, Stage1WithGradientAccumulation) {
  Loop whole, sharded;
  whole.accumulation = sharded.accumulation = 3;
  sharded.zero_stage = 1;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_EQ(a.norms.size(), 4u);  // 12 batches, a step every 3
  EXPECT_LE(test::max_relative_difference(b.params, a.params), 0.0) << "bit for bit";
  expect_same_norms(b.norms, a.norms);
}

TEST(AcceleratorZero, Fp16SkipsTheSameStepsAsUnsharded) {
  Loop whole, sharded;
  whole.precision = sharded.precision = Precision::Fp16;
  whole.inf_at = sharded.inf_at = 4;
  whole.batches = sharded.batches = 8;
  sharded.zero_stage = 1;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_EQ(a.skipped, (std::vector<bool>{false, false, false, false, true, false, false, false}));
  EXPECT_EQ(b.skipped, a.skipped);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), 0.0) << "bit for bit";
}

TEST(AcceleratorZero, ACheckpointResumesShardedOrWhole) {
  const std::string root = "/tmp/tandem-zero-ckpt-" + std::to_string(getppid());
  if (test::pg().rank() == 0) (void)!std::system(("rm -rf " + root).c_str());
  test::pg().barrier();
  Loop straight;
  straight.zero_stage = 1;
  straight.save_to = root;
  straight.save_after = 6;
  const Outcome uninterrupted = train(straight);
  Loop resumed;
  resumed.zero_stage = 1;
  resumed.save_after = 6;
  resumed.resume_from = root;
  const Outcome after = train(resumed);
  // Bit for bit on up to two ranks. On more, the resumed job's first step reduces in DDP's initial
  // bucket layout, the uninterrupted one in the rebuilt layout: another summation order, a few
  // ulps (plain DDP resumes the same way).
  const double tolerance = test::pg().size() <= 2 ? 0.0 : 1e-6;
  EXPECT_LE(test::max_relative_difference(after.params, uninterrupted.params), tolerance);
  // The same checkpoint into a whole optimizer (Note [Optimizer state by name]): the same run.
  Loop whole;
  whole.resume_from = root;
  whole.save_after = 6;
  EXPECT_LE(test::max_relative_difference(train(whole).params, uninterrupted.params), tolerance);
  test::pg().barrier();
  if (test::pg().rank() == 0) (void)!std::system(("rm -rf " + root).c_str());
}

// ---- stage 2: gradients reduce-scattered, AdamW stepping flat slices ------------------------------
// Not bit for bit: the flat slices' element-wise arithmetic is the same, but the reduce-scatter
// may sum in another order than the all-reduce (MPI), the vector kernels meet the elements at
// other alignments, and the clip norm is summed over shards. The bound: 1e-6 relative.

constexpr double kStage2Tolerance = 1e-6;

void expect_close_norms(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::abs(b[i])) << "step " << i;
}

TEST(AcceleratorZero, Stage2EqualsStage0WithClippingAndTwoParamGroups) {
  Loop whole, sharded;
  whole.batches = sharded.batches = 20;
  sharded.zero_stage = 2;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
  EXPECT_GT(a.norms.front(), 0.5) << "the clip must act for the test to mean something";
}

// The parameters given are the ones clipped, as torch clips them unsharded: here the first
// layer's, whose norm alone is clipped (the other layers' gradients stay as they are).
TEST(AcceleratorZero, Stage2ClipsOnlyTheGivenParameters) {
  Loop whole, sharded;
  whole.clip_first_layer = sharded.clip_first_layer = true;
  whole.max_norm = sharded.max_norm = 0.2;
  sharded.zero_stage = 2;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
  EXPECT_GT(a.norms.front(), 0.2) << "the clip must act for the test to mean something";
}

TEST(AcceleratorZero, Stage2WithGradientAccumulation) {
  Loop whole, sharded;
  whole.accumulation = sharded.accumulation = 3;
  sharded.zero_stage = 2;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_EQ(a.norms.size(), 4u);  // 12 batches, a step every 3
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
}

TEST(AcceleratorZero, Stage2Fp16SkipsTheSameStepsAsUnsharded) {
  Loop whole, sharded;
  whole.precision = sharded.precision = Precision::Fp16;
  whole.inf_at = sharded.inf_at = 4;
  whole.batches = sharded.batches = 8;
  sharded.zero_stage = 2;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_EQ(b.skipped, a.skipped);
  EXPECT_TRUE(b.skipped[4]);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
}

// FSDP (ZeRO-3) through the Accelerator: the same loop, each Linear a unit (auto-wrap), against
// stage 0; the same tolerance as stage 2 (the reduce-scatter adds in another order than DDP's
// all-reduce).
TEST(AcceleratorFsdp, EqualsStage0WithClippingAndTwoParamGroups) {
  Loop whole, sharded;
  whole.batches = sharded.batches = 20;
  sharded.fsdp = true;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
  EXPECT_GT(a.norms.front(), 0.5) << "the clip must act for the test to mean something";
}

// Two FSDP optimizers (each of the two param groups its own AdamW): one clip_grad_norm over both
// models' shards, as torch clips the whole model (it was refused while each optimizer clipped its
// own pieces).
TEST(AcceleratorFsdp, TwoOptimizersClipTogether) {
  Loop whole, sharded;
  whole.batches = sharded.batches = 20;
  sharded.fsdp = sharded.two_optimizers = true;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
  EXPECT_GT(a.norms.front(), 0.5) << "the clip must act for the test to mean something";
}

// HSDP through the Accelerator: shards within pairs, replicas across them (4 processes as 2 x 2),
// with clipping and fp16's skipped steps; a checkpoint of it resumes to the uninterrupted run.
TEST(AcceleratorFsdp, HsdpEqualsStage0) {
  if (test::pg().size() != 4) GTEST_SKIP() << "laid out for 4 processes (2 x 2)";
  Loop whole, hybrid;
  whole.batches = hybrid.batches = 20;
  hybrid.fsdp = true;
  hybrid.shard_size = 2;
  const Outcome a = train(whole), b = train(hybrid);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
  EXPECT_GT(a.norms.front(), 0.5) << "the clip must act for the test to mean something";
  Loop fp16_whole, fp16_hybrid;
  fp16_whole.precision = fp16_hybrid.precision = Precision::Fp16;
  fp16_whole.inf_at = fp16_hybrid.inf_at = 3;
  fp16_hybrid.fsdp = true;
  fp16_hybrid.shard_size = 2;
  EXPECT_EQ(train(fp16_hybrid).skipped, train(fp16_whole).skipped);
}

// FSDP on a (W, 1) mesh replicates, as fully_shard on one does: every process holds whole
// parameters and the replicas all-reduce. replicate_size(W) used to shard over every process
// while reporting "replicate W" (which trains alike: LayoutPlan's test is the one that saw it);
// here, that the replicated layout trains as stage 0.
TEST(AcceleratorFsdp, ReplicasOfOneShardEqualStage0) {
  if (test::pg().size() == 1) GTEST_SKIP() << "replicas need 2 processes or more";
  Loop whole, replicated;
  replicated.fsdp = true;
  replicated.replicate_size = test::pg().size();
  replicated.shard_size = 1;
  const Outcome a = train(whole), b = train(replicated);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
  replicated.shard_size = 0;  // the shards take what replicate_size leaves: 1
  const Outcome c = train(replicated);
  EXPECT_LE(test::max_relative_difference(c.params, a.params), kStage2Tolerance);
}

TEST(AcceleratorFsdp, HsdpCheckpointResumes) {
  if (test::pg().size() != 4) GTEST_SKIP() << "laid out for 4 processes (2 x 2)";
  const std::string root = "/tmp/tandem-hsdp-ckpt-" + std::to_string(getppid());
  if (test::pg().rank() == 0) (void)!std::system(("rm -rf " + root).c_str());
  test::pg().barrier();
  Loop straight, resumed;
  straight.fsdp = resumed.fsdp = true;
  straight.shard_size = resumed.shard_size = 2;
  straight.save_to = root;
  straight.save_after = resumed.save_after = 6;
  resumed.resume_from = root;
  const Outcome uninterrupted = train(straight);
  EXPECT_EQ(test::max_relative_difference(train(resumed).params, uninterrupted.params), 0.0)
      << "resumed HSDP differs from the uninterrupted run";
  // The same checkpoint under plain FSDP over the 4 processes (another layout of the rows).
  Loop fsdp;
  fsdp.fsdp = true;
  fsdp.resume_from = root;
  fsdp.save_after = 6;
  EXPECT_LE(test::max_relative_difference(train(fsdp).params, uninterrupted.params), kStage2Tolerance);
  test::pg().barrier();
  if (test::pg().rank() == 0) (void)!std::system(("rm -rf " + root).c_str());
}

TEST(AcceleratorFsdp, ClipsOnlyTheGivenParameters) {
  Loop whole, sharded;
  whole.clip_first_layer = sharded.clip_first_layer = true;
  whole.max_norm = sharded.max_norm = 0.2;
  sharded.fsdp = true;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
  EXPECT_GT(a.norms.front(), 0.2) << "the clip must act for the test to mean something";
}

// Adagrad fills its state when it is made (step 0, sum = initial_accumulator_value): FSDP makes
// it again for the shards and steps as the unsharded Adagrad does.
TEST(AcceleratorFsdp, AdagradEqualsStage0) {
  Loop whole, sharded;
  whole.adagrad = sharded.adagrad = true;
  sharded.fsdp = true;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
}

TEST(AcceleratorFsdp, WithGradientAccumulation) {
  Loop whole, sharded;
  whole.accumulation = sharded.accumulation = 3;
  sharded.fsdp = true;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_EQ(a.norms.size(), 4u);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  expect_close_norms(b.norms, a.norms);
}

// Under autocast alone (the policy's param_dtype float32), FSDP's arithmetic is the unsharded
// one's; under the Accelerator's default fp16 policy (gathered, computed and reduced in float16)
// the GradScaler still sees the inf through the float16 reduce-scatter and every rank skips the
// same step. (The forward is autocast's either way; the gradients' reduction dtype differs.)
TEST(AcceleratorFsdp, Fp16SkipsTheSameStepsAsUnsharded) {
  Loop whole, sharded;
  whole.precision = sharded.precision = Precision::Fp16;
  whole.inf_at = sharded.inf_at = 4;
  whole.batches = sharded.batches = 8;
  sharded.fsdp = true;
  sharded.fsdp_param_dtype = at::kFloat;
  const Outcome a = train(whole), b = train(sharded);
  EXPECT_EQ(b.skipped, a.skipped);
  EXPECT_TRUE(b.skipped[4]);
  EXPECT_LE(test::max_relative_difference(b.params, a.params), kStage2Tolerance);
  sharded.fsdp_param_dtype.reset();
  const Outcome c = train(sharded);
  EXPECT_EQ(c.skipped, a.skipped);
  for (const auto& p : c.params) {
    EXPECT_EQ(p.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::isfinite(p).all().item<bool>());
  }
}

// The Accelerator's mixed precision becomes FSDP's policy, as accelerate sets FSDP2's: the units
// gather in bfloat16 (half the bytes of float32), the shards stay float32.
TEST(AcceleratorFsdp, MixedPrecisionSetsTheFsdpPolicy) {
  auto gathered = [](Precision precision) {
    Accelerator acc(test::shared_pg(),
                    AcceleratorOptions().seed(3).progress(false).strategy(Strategy::Fsdp).mixed_precision(precision));
    torch::manual_seed(3);
    auto net = zero_net();
    auto model = acc.prepare_model(net);
    for (const auto& [name, shard] : model->fsdp()->named_shard_parameters()) EXPECT_EQ(shard.scalar_type(), at::kFloat);
    return model->fsdp()->memory().two_largest_units;
  };
  EXPECT_EQ(gathered(Precision::Bf16) * 2, gathered(Precision::No));
}

// A checkpoint under FSDP's bf16 policy holds the float32 shards' values, and resumes: into the
// same policy bit for bit, and into a float32 run (the weights are float32 either way).
TEST(AcceleratorFsdp, ABf16CheckpointResumes) {
  const std::string root = "/tmp/tandem-fsdp-bf16-ckpt-" + std::to_string(getppid());
  if (test::pg().rank() == 0) (void)!std::system(("rm -rf " + root).c_str());
  test::pg().barrier();
  Loop straight;
  straight.fsdp = true;
  straight.precision = Precision::Bf16;
  straight.save_to = root;
  straight.save_after = 6;
  const Outcome uninterrupted = train(straight);
  Loop resumed = straight;
  resumed.save_to.clear();
  resumed.resume_from = root;
  EXPECT_LE(test::max_relative_difference(train(resumed).params, uninterrupted.params), 0.0) << "bit for bit";
  // Six float32 steps from the same weights: near the bf16 run's (a checkpoint loaded wrongly, or
  // not at all, is as far as the weights themselves: relative distance about 1).
  Loop fp32 = resumed;
  fp32.precision = Precision::No;
  const Outcome in_fp32 = train(fp32);
  double distance = 0, norm = 0;
  for (size_t i = 0; i < in_fp32.params.size(); ++i) {
    distance += (in_fp32.params[i] - uninterrupted.params[i]).pow(2).sum().item<double>();
    norm += uninterrupted.params[i].pow(2).sum().item<double>();
  }
  if (test::pg().rank() == 0) std::printf("bf16 checkpoint resumed in float32: relative distance %.3g\n", std::sqrt(distance / norm));
  EXPECT_LE(std::sqrt(distance / norm), 0.05);
  test::pg().barrier();
  if (test::pg().rank() == 0) (void)!std::system(("rm -rf " + root).c_str());
}

TEST(AcceleratorFsdp, RefusesAZeroStage) {
  EXPECT_ERROR(Accelerator(test::shared_pg(), AcceleratorOptions().zero_stage(2).strategy(Strategy::Fsdp)),
               "Accelerator: zero_stage 2 with Strategy::Fsdp: FSDP shards parameters, gradients and optimizer state "
               "already (ZeRO-3); leave zero_stage at 0");
}

TEST(AcceleratorZero, BadStagesAreNamed) {
  EXPECT_ERROR_HAS(Accelerator(test::shared_pg(), AcceleratorOptions().zero_stage(3)),
                   "Accelerator: zero_stage 3 is not available");
  EXPECT_ERROR_HAS(Accelerator(test::shared_pg(), AcceleratorOptions().zero_stage(-1)), "zero_stage -1 is not available");
  if (test::pg().size() == 1) {
    EXPECT_ERROR_HAS(Accelerator(test::shared_pg(), AcceleratorOptions().zero_stage(1).strategy(Strategy::DataParallel)
                                                        .dp(dp::DataParallelOptions().devices({c10::kCPU, c10::kCPU}))),
                     "DataParallel runs in one");
  }
}
