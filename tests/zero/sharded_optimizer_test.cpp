// ZeRO-1 (tandem::zero::ShardedOptimizer) against plain DDP with the whole optimizer, run as a
// world of one and as every rank of a `tandem run` job (2, 3 and 4 ranks; Gloo and MPI). The
// model's layer sizes divide no world size; two param groups with their own learning rates and
// weight decay; 20 steps on each rank's own data.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <memory>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/activation.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/nn/utils/clip_grad.h>

#include "support/distributed_main.h"
#include "zero/zero_test_models.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/error.h"
#include "tandem/zero/sharded_optimizer.h"
#include "tandem/zero/state_bytes.h"

using tandem::test::pg;
using tandem::test::shared_pg;
using tandem::zero::ShardedOptimizer;
using namespace tandem::test::zero;

namespace {

// 20 steps of DDP on each rank's own batch; `zero` shards the optimizer. Returns the parameters.
std::vector<at::Tensor> train(const MakeOptimizer& make, bool zero, int64_t* states = nullptr,
                              int64_t* state_bytes = nullptr) {
  auto net = make_net();
  tandem::ddp::DistributedDataParallel model(net, shared_pg());
  auto optimizer = make(split_params(*net));
  std::unique_ptr<ShardedOptimizer> sharded;
  if (zero) sharded = std::make_unique<ShardedOptimizer>(*optimizer, shared_pg());
  torch::manual_seed(100 + pg().rank());
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor x = torch::randn({8, 13}), y = torch::randn({8, 3});
    at::Tensor loss = (model->forward(x) - y).pow(2).mean();
    loss.backward();
    if (zero) {
      sharded->step();
      sharded->zero_grad();
    } else {
      optimizer->step();
      optimizer->zero_grad();
    }
  }
  if (states) *states = static_cast<int64_t>(optimizer->state().size());
  if (state_bytes) *state_bytes = tandem::zero::optimizer_state_bytes(*optimizer);
  std::vector<at::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST(ShardedOptimizer, EqualsPlainDdpWithTheWholeOptimizer) {
  for (const auto& [name, make] : optimizers()) {
    int64_t whole_bytes = -1, states = -1, bytes = -1;
    const auto plain = train(make, /*zero=*/false, nullptr, &whole_bytes);
    const auto sharded = train(make, /*zero=*/true, &states, &bytes);
    // The shards' state adds up to the whole optimizer's, byte for byte.
    at::Tensor sum = at::full({1}, bytes, at::kLong);
    pg().all_reduce(sum);
    EXPECT_EQ(sum.item<int64_t>(), whole_bytes) << name;
    EXPECT_GT(whole_bytes, 0) << name;
    EXPECT_EQ(max_relative_difference(sharded, plain), 0.0) << name << " on " << pg().size() << " ranks: bit for bit";
    // Sharded: state only for the parameters this rank owns (6 parameters in all).
    auto net = make_net();
    auto optimizer = make(split_params(*net));
    ShardedOptimizer probe(*optimizer, shared_pg());
    int owned = 0;
    for (size_t g = 0; g < probe.all_params().size(); ++g) {
      for (size_t i = 0; i < probe.all_params()[g].size(); ++i) owned += probe.owner(g, i) == pg().rank();
    }
    EXPECT_EQ(states, owned) << name;
    // Every rank ends with the same weights.
    for (const auto& mine : sharded) {
      at::Tensor p = mine.clone();
      pg().broadcast(p, 0);
      EXPECT_TRUE(at::equal(mine, p)) << name << ": rank " << pg().rank() << " differs from rank 0";
    }
  }
}

TEST(ShardedOptimizer, OwnsWhatPyTorchsRuleAssigns) {
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  {
    ShardedOptimizer sharded(sgd, shared_pg());
    // One group, sizes 143, 11, 77, 7, 21, 3: largest first to the lightest rank (the oracle
    // table's "one_group" model has the same shape of answer: tests/zero/partition_test.cpp).
    const std::vector<int> two{0, 1, 1, 1, 1, 1}, three{0, 2, 1, 2, 2, 2}, four{0, 3, 1, 3, 2, 3};
    const std::vector<int>* expected = pg().size() == 2 ? &two : pg().size() == 3 ? &three : pg().size() == 4 ? &four : nullptr;
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(sharded.owner(0, i), expected ? (*expected)[i] : 0) << "parameter " << i;
    }
    int64_t total = 0;
    for (int64_t n : sharded.owned_numel()) total += n;
    EXPECT_EQ(total, 143 + 11 + 77 + 7 + 21 + 3);
    size_t mine = 0;
    for (size_t i = 0; i < 6; ++i) mine += sharded.owner(0, i) == pg().rank();
    EXPECT_EQ(sgd.param_groups()[0].params().size(), mine) << "the optimizer holds this rank's parameters only";
  }
}

TEST(ShardedOptimizer, RefusesWhatItCannotShard) {
  auto net = make_net();
  torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(1));
  try {
    ShardedOptimizer sharded(lbfgs, shared_pg());
    FAIL() << "LBFGS accepted";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("LBFGS cannot be sharded"), std::string::npos) << e.what();
  }
  // A sparse gradient: refused before anything changes, on every rank alike.
  torch::nn::Embedding embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true));
  torch::optim::SGD sgd(embedding->parameters(), torch::optim::SGDOptions(0.1));
  ShardedOptimizer sharded(sgd, shared_pg());
  embedding->forward(torch::tensor({1, 2}, at::kLong)).sum().backward();
  try {
    sharded.step();
    FAIL() << "a sparse gradient accepted";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sparse gradient"), std::string::npos) << e.what();
  }
  // Parameters added after sharding.
  torch::optim::SGD grown(net->parameters(), torch::optim::SGDOptions(0.1));
  ShardedOptimizer grown_sharded(grown, shared_pg());
  grown.add_param_group(torch::optim::OptimizerParamGroup({torch::zeros({2}, torch::requires_grad())}));
  try {
    grown_sharded.step();
    FAIL() << "a changed optimizer accepted";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("param groups changed"), std::string::npos) << e.what();
  }
}

// A step that fails or disagrees on one rank fails on every rank, never hangs the exchange; the
// gradients others own are gone after a step, so the caller's own zero_grad leaves none stale.
TEST(ShardedOptimizer, EveryRankFailsTogetherAndNoGradientIsLeftStale) {
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  ShardedOptimizer sharded(sgd, shared_pg());
  auto backward = [&] { net->forward(torch::ones({2, 13})).sum().backward(); };
  backward();
  const bool last = pg().rank() == pg().size() - 1;
  try {
    sharded.step([&](torch::optim::Optimizer&) -> bool {
      if (last) throw tandem::Error("boom on the last rank");
      return true;
    });
    FAIL() << "a failed step went on";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find(last ? "boom on the last rank" : "another rank's optimizer step failed"),
              std::string::npos) << e.what();
  }
  if (pg().size() > 1) {
    try {
      sharded.step([&](torch::optim::Optimizer&) { return pg().rank() == 0; });
      FAIL() << "ranks that disagree went on";
    } catch (const tandem::Error& e) {
      EXPECT_NE(std::string(e.what()).find("disagree on whether to step"), std::string::npos) << e.what();
    }
  }
  sharded.step();
  for (size_t i = 0; i < sharded.all_params()[0].size(); ++i) {
    const at::Tensor& p = sharded.all_params()[0][i];
    EXPECT_EQ(p.grad().defined(), sharded.owner(0, i) == pg().rank()) << "parameter " << i;
  }
  sgd.zero_grad();  // the caller's own: reaches the owned parameters only, and that is enough
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
}

// A rank where no parameter has a gradient (here every rank but 0: the one gradient is of rank 0's
// parameter, and the others keep no copy of it) enters the norm's all-reduce all the same: every
// rank returns torch's norm over the gradients where they count, and rank 0's is clipped as torch
// clips it.
TEST(ShardedOptimizer, ClipGradNormWithNoGradientOnSomeRanksEqualsTorch) {
  at::Tensor big = torch::ones({10}, torch::requires_grad()), small = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD sgd(std::vector<at::Tensor>{big, small}, torch::optim::SGDOptions(0.1));
  ShardedOptimizer sharded(sgd, shared_pg());  // big to rank 0
  ASSERT_EQ(sharded.owner(0, 0), 0);
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    const at::Tensor g = torch::arange(10, at::kFloat) / 3;
    at::Tensor whole = torch::ones({10}, torch::requires_grad()), other = torch::ones({2}, torch::requires_grad());
    whole.mutable_grad() = g.clone();
    const double expected = torch::nn::utils::clip_grad_norm_({whole, other}, 1.0, norm_type);
    big.mutable_grad() = pg().rank() == 0 ? g.clone() : at::Tensor();
    small.mutable_grad() = at::Tensor();
    EXPECT_EQ(sharded.clip_grad_norm({big, small}, 1.0, norm_type), expected) << norm_type;
    if (pg().rank() == 0) {
      EXPECT_TRUE(at::equal(big.grad(), whole.grad())) << norm_type;
    }
  }
}

// The same on CUDA (scripts/gpu-check): the norms' all-reduce is NCCL's, on the device, and its
// flags went with them (a CPU tensor among the CUDA norms made at::cat fail); the clipped gradient
// and the norm equal torch's, for both norm types.
TEST(ShardedOptimizerGpu, ClipGradNormOnCudaEqualsTorch) {
  if (!tandem::test::every_rank_has_nccl()) GTEST_SKIP() << tandem::test::why_no_nccl();
  const auto cuda = *pg().cuda_device();
  const auto on = at::TensorOptions().device(cuda).requires_grad(true);
  at::Tensor big = torch::ones({10}, on), small = torch::ones({2}, on);
  torch::optim::SGD sgd(std::vector<at::Tensor>{big, small}, torch::optim::SGDOptions(0.1));
  ShardedOptimizer sharded(sgd, shared_pg());
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    const at::Tensor g = torch::arange(10, at::TensorOptions().device(cuda)) / 3;
    const at::Tensor h = torch::full({2}, 0.5, at::TensorOptions().device(cuda));
    at::Tensor whole = torch::ones({10}, on), other = torch::ones({2}, on);
    whole.mutable_grad() = g.clone();
    other.mutable_grad() = h.clone();
    const double expected = torch::nn::utils::clip_grad_norm_({whole, other}, 1.0, norm_type);
    big.mutable_grad() = sharded.owner(0, 0) == pg().rank() ? g.clone() : at::Tensor();
    small.mutable_grad() = sharded.owner(0, 1) == pg().rank() ? h.clone() : at::Tensor();
    EXPECT_NEAR(sharded.clip_grad_norm({big, small}, 1.0, norm_type), expected, 1e-6 * expected)
        << norm_type;
    if (sharded.owner(0, 0) == pg().rank()) {
      EXPECT_TRUE(at::allclose(big.grad(), whole.grad())) << norm_type;
    }
    if (sharded.owner(0, 1) == pg().rank()) {
      EXPECT_TRUE(at::allclose(small.grad(), other.grad())) << norm_type;
    }
  }
}

// A float16 gradient that only its owner sees: its GradScaler refuses it, and every rank fails.
TEST(ShardedOptimizer, AGradientOneRankRefusesFailsEveryRank) {
  if (pg().size() < 2) GTEST_SKIP() << "one rank owns everything";
  at::Tensor big = torch::ones({10}, torch::requires_grad());
  at::Tensor small = torch::ones({2}, torch::TensorOptions().dtype(at::kHalf).requires_grad(true));
  torch::optim::SGD sgd(std::vector<at::Tensor>{big, small}, torch::optim::SGDOptions(0.1));
  ShardedOptimizer sharded(sgd, shared_pg());  // big to rank 0, small to rank 1
  ASSERT_EQ(sharded.owner(0, 1), 1);
  tandem::amp::GradScaler scaler(shared_pg());
  (scaler.scale(big.sum() + small.sum().to(at::kFloat))).backward();
  try {
    sharded.step([&](torch::optim::Optimizer& o) { return scaler.step(o); });
    FAIL() << "a float16 gradient went through";
  } catch (const tandem::Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("float16") != std::string::npos || what.find("another rank") != std::string::npos) << what;
  }
}

int main(int argc, char** argv) { return tandem::test::distributed_test_main(argc, argv); }
