// The tensor-parallel region's generators (tandem/nn/region_rng.h) and Megatron's seeding
// (tandem/tp/random.h), in one process. The oracle: a generator seeded by hand with the seed the
// formula names draws what the region draws.
#include <gtest/gtest.h>

#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include "support/errors.h"
#include "tandem/nn/checkpoint.h"
#include "tandem/nn/region_rng.h"
#include "tandem/tp/random.h"

namespace {

using tandem::nn::RegionRng;
namespace tp = tandem::tp;

at::Tensor seeded_rand(uint64_t seed, int64_t n) {
  torch::manual_seed(seed);
  return at::rand({n});
}

at::Tensor region_rand(int64_t n) {
  RegionRng region;
  return at::rand({n});
}

TEST(RegionRng, DrawsItsOwnStreamAndLeavesTheDefaultWhereItWas) {
  const at::Tensor expected_default = seeded_rand(1, 6);
  const at::Tensor expected_region = seeded_rand(5, 6);
  tandem::nn::seed_region_rng(5);
  torch::manual_seed(1);
  const at::Tensor a = at::rand({3});
  const at::Tensor r1 = region_rand(2);
  const at::Tensor b = at::rand({3});
  const at::Tensor r2 = region_rand(4);
  EXPECT_TRUE(at::equal(at::cat({a, b}), expected_default)) << "the default goes on as if the region never drew";
  EXPECT_TRUE(at::equal(at::cat({r1, r2}), expected_region)) << "each region goes on where the last stopped";
}

TEST(RegionRng, NestedRegionsShareOneStream) {
  tandem::nn::seed_region_rng(9);
  at::Tensor inner, outer;
  {
    RegionRng region;
    outer = at::rand({2});
    inner = region_rand(2);
  }
  EXPECT_TRUE(at::equal(at::cat({outer, inner}), seeded_rand(9, 4)));
}

// Megatron: the group's ranks draw alike outside the region, each its own inside; stages apart.
TEST(TpManualSeed, MegatronsSeeds) {
  const tp::ParallelRanks first{3, 0, 0}, second_tp{3, 1, 0}, second_stage{3, 0, 1};
  EXPECT_EQ(tp::default_seed(42, first), 45u);
  EXPECT_EQ(tp::default_seed(42, second_tp), 45u);
  EXPECT_EQ(tp::default_seed(42, second_stage), 45u + (uint64_t{1} << 20));
  EXPECT_EQ(tp::region_seed(42, first), 45u + 2718u);
  EXPECT_EQ(tp::region_seed(42, second_tp), 45u + 2719u);
  auto draws = [](const tp::ParallelRanks& ranks) {
    tp::manual_seed(42, ranks);
    at::Tensor outside = at::rand({4});
    return std::make_pair(outside, region_rand(4));
  };
  const auto [out0, in0] = draws(first);
  const auto [out1, in1] = draws(second_tp);
  const auto [out_stage, in_stage] = draws(second_stage);
  EXPECT_TRUE(at::equal(out0, out1)) << "a tensor-parallel group draws alike outside the region";
  EXPECT_FALSE(at::equal(in0, in1)) << "and apart inside it";
  EXPECT_TRUE(at::equal(in1, seeded_rand(42 + 3 + 2718 + 1, 4)));
  EXPECT_FALSE(at::equal(out0, out_stage)) << "every pipeline stage draws its own";
}

// A checkpointed block with dropout inside and outside the region: the recompute draws the same
// masks in both (the region's state is captured and restored with the defaults'), and both
// generators go on afterwards as in the plain run.
struct RegionBlockImpl : torch::nn::Module {
  RegionBlockImpl()
      : fc(register_module("fc", torch::nn::Linear(6, 6))),
        cut(register_module("cut", torch::nn::Dropout(0.5))),
        whole(register_module("whole", torch::nn::Dropout(0.5))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = fc(x);
    {
      RegionRng region;
      h = cut(h);
    }
    return whole(h) + x;
  }
  torch::nn::Linear fc;
  torch::nn::Dropout cut, whole;
};
TORCH_MODULE(RegionBlock);

struct RegionRun {
  at::Tensor out, grad_x, grad_w, default_after, region_after;
};

void expect_region_runs_identical(c10::Device device) {
  auto run = [device](bool checkpointed) {
    torch::manual_seed(0);
    RegionBlock block;
    block->to(device);
    at::Tensor x = at::randn({5, 6}).to(device).requires_grad_(true);
    tp::manual_seed(7, {0, 1, 0});
    RegionRun r;
    r.out = checkpointed ? tandem::nn::checkpoint(block, x) : block->forward(x);
    r.out.pow(2).sum().backward();
    r.grad_x = x.grad().clone();
    r.grad_w = block->fc->weight.grad().clone();
    r.default_after = at::rand({3}, at::TensorOptions().device(device));
    {
      RegionRng region;
      r.region_after = at::rand({3}, at::TensorOptions().device(device));
    }
    return r;
  };
  const RegionRun plain = run(false), got = run(true);
  EXPECT_TRUE(at::equal(plain.out, got.out));
  EXPECT_TRUE(at::equal(plain.grad_x, got.grad_x));
  EXPECT_TRUE(at::equal(plain.grad_w, got.grad_w));
  EXPECT_TRUE(at::equal(plain.default_after, got.default_after));
  EXPECT_TRUE(at::equal(plain.region_after, got.region_after));
}

TEST(RegionRng, ACheckpointedRecomputeDrawsTheForwardsMasks) { expect_region_runs_identical(c10::Device(c10::kCPU)); }

// The same on the GPU (gpu.nn.checkpoint): the CUDA generator's region state is swapped, captured
// and restored as the CPU's is.
TEST(CheckpointCuda, RegionDropoutOnTheGpuIsBitIdentical) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device visible";
  expect_region_runs_identical(c10::Device(c10::kCUDA, 0));
}

TEST(RegionRngErrors, BadInputs) {
  EXPECT_ERROR(tp::manual_seed(1, {0, -1, 0}), "tp::manual_seed: ranks must be >= 0, got dp 0, tp -1, pp 0");
  RegionRng region;
  EXPECT_ERROR(tandem::nn::seed_region_rng(1),
                  "nn::seed_region_rng: called inside a RegionRng: seed before entering the region");
}

}  // namespace
