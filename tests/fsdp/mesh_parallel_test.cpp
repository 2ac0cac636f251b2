// Data-parallel strategies over one dimension of a device mesh, held to the single-process oracle:
// DDP and ZeRO-1 over mesh["dp"] (each dp group trains on its own members' batches), and HSDP
// (FSDP sharded within "shard", replicated across "replicate"). One binary, run as a world of one
// and as 2 and 4 ranks (Gloo and MPI); at 4 ranks the meshes are 2 x 2, 4 x 1 and 1 x 4.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/adamw.h>

#include "../zero/zero_test_models.h"
#include "support/distributed_main.h"
#include "support/errors.h"
#include "support/raise_in_backward.h"
#include "tandem/comm/device_mesh.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/fsdp/auto_wrap.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/zero/sharded_optimizer.h"

using tandem::comm::DeviceMesh;
using tandem::test::pg;
using tandem::test::shared_pg;
using namespace tandem::test::zero;

namespace {

namespace fsdp = tandem::fsdp;

// Sums of two gradients are the same in either order, so reductions over groups of at most two
// ranks are bit for bit the oracle's in float32. Larger groups add in the backend's order (Gloo's
// ring, MPI's tree), which differs from the oracle's in the last bits, and 20 steps of AdamW
// amplify those on parameters near zero: there the run is in float64, where no order reaches 1e-9.
at::ScalarType dtype_for(int largest_group) { return largest_group > 2 ? at::kDouble : at::kFloat; }
double tolerance_for(at::ScalarType dtype) { return dtype == at::kDouble ? 1e-9 : 1e-6; }

torch::nn::Sequential make_net_as(at::ScalarType dtype) {
  auto net = make_net();
  net->to(dtype);
  return net;
}

// Global rank g's batch at `step`: the same wherever it is drawn.
std::pair<at::Tensor, at::Tensor> batch(int step, int g, at::ScalarType dtype) {
  torch::manual_seed(1000 * step + g);
  at::Tensor x = torch::randn({8, 13});
  return {x.to(dtype), torch::randn({8, 3}).to(dtype)};
}

at::Tensor loss_of(torch::nn::Sequential& net, int step, int g, at::ScalarType dtype) {
  auto [x, y] = batch(step, g, dtype);
  return (net->forward(x) - y).pow(2).mean();
}

// 1/n as a wrapped number, as DDP and FSDP multiply by it (the gradient keeps its dtype).
at::Tensor one_over(int64_t n) {
  auto inverse = at::scalar_tensor(1.0 / static_cast<double>(n), at::kDouble);
  inverse.unsafeGetTensorImpl()->set_wrapped_number(true);
  return inverse;
}

// Data parallelism written out in one process: `groups` of global ranks; each rank's gradient
// × 1/n (n: all ranks), summed within a group in rank order, then the groups' sums in order, as
// a reduce-scatter within the shard group and an all-reduce across the replicas add them.
std::vector<at::Tensor> reference(const std::vector<std::vector<int>>& groups, at::ScalarType dtype) {
  auto net = make_net_as(dtype);
  auto params = net->parameters();
  auto optimizer = optimizers()[2].second(split_params(*net));  // AdamW, two groups
  int64_t n = 0;
  for (const auto& g : groups) n += static_cast<int64_t>(g.size());
  const auto inverse = one_over(n);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<at::Tensor> total(params.size());
    for (const auto& group : groups) {
      std::vector<at::Tensor> partial(params.size());
      for (int g : group) {
        for (auto& p : params) p.mutable_grad() = at::Tensor();
        loss_of(net, step, g, dtype).backward();
        for (size_t i = 0; i < params.size(); ++i) {
          at::Tensor scaled = at::mul(params[i].grad(), inverse);
          partial[i] = partial[i].defined() ? partial[i].add(scaled) : scaled;
        }
      }
      for (size_t i = 0; i < params.size(); ++i) total[i] = total[i].defined() ? total[i].add(partial[i]) : partial[i];
    }
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = total[i];
    optimizer->step();
    optimizer->zero_grad();
  }
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

std::vector<std::vector<int>> shapes() {
  const int w = pg().size();
  std::vector<std::vector<int>> out{{w, 1}, {1, w}};
  if (w == 4) out.push_back({2, 2});
  return out;
}

// A (replicate, shard) mesh's shard groups in replica order: replica r holds ranks r*S .. r*S+S-1.
std::vector<std::vector<int>> shard_groups_of(const std::vector<int>& shape) {
  std::vector<std::vector<int>> groups(static_cast<size_t>(shape[0]));
  for (int r = 0; r < shape[0]; ++r) {
    for (int s = 0; s < shape[1]; ++s) groups[static_cast<size_t>(r)].push_back(r * shape[1] + s);
  }
  return groups;
}

// kSteps of the reference's training on this rank's batches; the parameters gathered whole.
template <typename Model>
std::vector<at::Tensor> train_and_gather(Model& model, torch::optim::Optimizer& optimizer, at::ScalarType dtype) {
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step, pg().rank(), dtype);
    (model->forward(x) - y).pow(2).mean().backward();
    optimizer.step();
    optimizer.zero_grad();
  }
  std::vector<at::Tensor> got;
  for (const auto& item : model->gather_parameters()) got.push_back(item.second);
  return got;
}

std::string text(const std::vector<int>& shape) { return std::to_string(shape[0]) + " x " + std::to_string(shape[1]); }

}  // namespace

// DDP over mesh["dp"]: each dp group is a data-parallel job of its own, on its members' batches.
TEST(MeshParallel, DdpAndZeroOverTheDpDimensionEqualTheirGroupsOracle) {
  for (const auto& shape : shapes()) {
    DeviceMesh mesh(shared_pg(), {shape[0], shape[1]}, {"dp", "tp"});
    auto dp = mesh.group("dp");
    const auto dtype = dtype_for(dp->size());
    const auto expected = reference({dp->global_ranks()}, dtype);
    for (bool zero : {false, true}) {
      auto net = make_net_as(dtype);
      tandem::ddp::DistributedDataParallel model(net, dp);
      auto optimizer = optimizers()[2].second(split_params(*net));
      std::unique_ptr<tandem::zero::ShardedOptimizer> sharded;
      if (zero) sharded = std::make_unique<tandem::zero::ShardedOptimizer>(*optimizer, dp);
      for (int step = 0; step < kSteps; ++step) {
        auto [x, y] = batch(step, pg().rank(), dtype);
        (model->forward(x) - y).pow(2).mean().backward();
        if (zero) {
          sharded->step();
          sharded->zero_grad();
        } else {
          optimizer->step();
          optimizer->zero_grad();
        }
      }
      std::vector<at::Tensor> got;
      for (const auto& p : net->parameters()) got.push_back(p.detach());
      const double diff = max_relative_difference(got, expected);
      if (pg().rank() == 0) std::printf("%s over dp of %s, %s: max relative difference %.3g\n", zero ? "ZeRO-1" : "DDP",
                                    text(shape).c_str(), c10::toString(dtype), diff);
      EXPECT_LE(diff, tolerance_for(dtype)) << (zero ? "ZeRO-1" : "DDP") << " over dp of a " << text(shape) << " mesh";
    }
  }
}

// HSDP: shards within "shard", replicas across "replicate": the average over every rank.
TEST(MeshParallel, HsdpEqualsDataParallelOverEveryRank) {
  for (const auto& shape : shapes()) {
    DeviceMesh mesh(shared_pg(), {shape[0], shape[1]}, {"replicate", "shard"});
    const auto shard_groups = shard_groups_of(shape);
    const auto dtype = dtype_for(std::max(shape[0], shape[1]));
    const auto expected = reference(shard_groups, dtype);
    auto net = make_net_as(dtype);
    fsdp::wrap_entries(*net);
    auto optimizer = optimizers()[2].second(split_params(*net));
    fsdp::FullyShardedDataParallel model(net, mesh);
    fsdp::shard_optimizer(*optimizer, model->engine());
    const auto got = train_and_gather(model, *optimizer, dtype);
    const double diff = max_relative_difference(got, expected);
    if (pg().rank() == 0) std::printf("HSDP %s, %s: max relative difference %.3g\n", text(shape).c_str(), c10::toString(dtype), diff);
    EXPECT_LE(diff, tolerance_for(dtype)) << "HSDP over a " << text(shape) << " mesh";
    // Replicas hold the same shards.
    for (const auto& item : model->named_shard_parameters()) {
      auto all = mesh.group("replicate")->all_gather(item.second.detach().reshape({-1}).contiguous());
      for (const auto& theirs : all) EXPECT_TRUE(at::equal(theirs, all[0])) << item.first;
    }
  }
}

// Note [Replicas during backward]: a unit's all-reduce across the replicas starts while backward
// goes on, not after it. The input's gradient is computed by the first layer's backward, before
// the end of backward: by then the last layer's rows were all-reduced or on their way.
TEST(MeshParallel, HsdpAllReducesAcrossTheReplicasDuringBackward) {
  if (pg().size() < 2) GTEST_SKIP() << "needs two replicas";
  DeviceMesh mesh(shared_pg(), {2, pg().size() / 2}, {"replicate", "shard"});
  auto net = make_net();
  fsdp::wrap_entries(*net);
  fsdp::FullyShardedDataParallel model(net, mesh);
  const auto& replicas = *mesh.group("replicate");
  auto [x, y] = batch(0, pg().rank(), at::kFloat);
  x.requires_grad_(true);
  const uint64_t before = replicas.last_sequence_number();
  uint64_t at_input = 0;
  x.register_hook([&](const at::Tensor&) { at_input = replicas.last_sequence_number(); });
  (model->forward(x) - y).pow(2).mean().backward();
  const uint64_t after = replicas.last_sequence_number();
  EXPECT_EQ(after - before, 3u) << "one all-reduce per Linear unit";
  EXPECT_GE(at_input - before, 1u) << "the replicas' all-reduces waited for the end of backward";
}

// A backward that raises at different places on the two replicas (Note [Failed backward]): one
// after two units were reduce-scattered and one all-reduced across the replicas, the other before
// any. The catch-up runs within each replica, then across them; the next steps train as if the
// failed one never ran, with no collective out of step.
namespace {
enum class RaiseAt : int64_t { Nowhere, Output, MidModel };
using Raising = tandem::test::RaiseInBackward<RaiseAt>;
using Raises = tandem::test::Raises<RaiseAt>;
}  // namespace

TEST(MeshParallel, HsdpRecoversFromABackwardThatRaisesAtDifferentPlacesOnTheReplicas) {
  for (const auto& shape : shapes()) {
    if (shape[0] < 2) continue;
    DeviceMesh mesh(shared_pg(), {shape[0], shape[1]}, {"replicate", "shard"});
    const auto shard_groups = shard_groups_of(shape);
    const auto dtype = dtype_for(std::max(shape[0], shape[1]));
    const auto expected = reference(shard_groups, dtype);
    // make_net()'s layers and initial values, with identities that may raise in backward.
    torch::manual_seed(7);
    torch::nn::Sequential net(torch::nn::Linear(13, 11), torch::nn::Tanh(), Raises(RaiseAt::MidModel),
                              torch::nn::Linear(11, 7), torch::nn::Tanh(), torch::nn::Linear(7, 3),
                              Raises(RaiseAt::Output));
    net->to(dtype);
    auto optimizer = optimizers()[2].second(split_params(*net));
    fsdp::wrap_entries(*net);
    fsdp::FullyShardedDataParallel model(net, mesh);
    fsdp::shard_optimizer(*optimizer, model->engine());
    {
      const int replica = pg().rank() / shape[1];
      Raising::armed() = replica == 0 ? RaiseAt::MidModel : RaiseAt::Output;
      auto [x, y] = batch(99, pg().rank(), dtype);
      EXPECT_ERROR_HAS((model->forward(x) - y).pow(2).mean().backward(), "injected failure in backward");
      Raising::armed() = RaiseAt::Nowhere;
    }
    const auto got = train_and_gather(model, *optimizer, dtype);
    EXPECT_LE(max_relative_difference(got, expected), tolerance_for(dtype)) << "HSDP over a " << text(shape) << " mesh";
  }
}

TEST(MeshParallel, HsdpRefusesGroupsThatAreNotAMesh) {
  if (pg().size() != 4) GTEST_SKIP() << "laid out for 4 ranks";
  // Both "replicate" and "shard" as the same pairs {0,1}, {2,3}: rank 0 and 1 would be replicas
  // holding different shards.
  auto pairs = pg().split(pg().rank() / 2, "pairs");
  auto net = make_net();
  fsdp::wrap_entries(*net);
  EXPECT_ERROR_HAS(fsdp::FullyShardedDataParallel(net, pairs, fsdp::FullyShardOptions().replicate_group(pairs)),
                   "of the replicate group is rank ");
}

int main(int argc, char** argv) { return tandem::test::distributed_test_main(argc, argv); }
