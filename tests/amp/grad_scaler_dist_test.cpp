// GradScaler across ranks: an inf/NaN on ONE rank makes every rank skip that step and back the
// scale off, because unscale() all-reduces found_inf (Note [Found inf across ranks]). Runs as a
// world of one and as 2 Gloo ranks under `tandem run`; GradScalerDistGpu on NCCL where a GPU is.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "support/distributed_main.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/distributed_data_parallel.h"

using namespace tandem;
using amp::GradScaler;
using amp::GradScalerOptions;

namespace {

int W() { return test::shared_pg()->size(); }
int R() { return test::shared_pg()->rank(); }

constexpr int kSteps = 8;
constexpr int kBadStep = 3;
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// Every rank's values of a scalar, gathered.
std::vector<double> everywhere(double value) {
  std::vector<double> out;
  for (auto& t : test::shared_pg()->all_gather(at::full({1}, value, at::kDouble))) out.push_back(t.item<double>());
  return out;
}

// The last rank's gradient is NaN at kBadStep; gradients are local (never synced) and differ
// across ranks, so only the scaler's all-reduce can make the ranks agree.
struct Trace {
  std::vector<bool> stepped;
  std::vector<double> scales;
};
Trace run_local_gradients(GradScaler& scaler, const c10::Device& device = c10::kCPU) {
  at::Tensor p = at::ones({3}, at::TensorOptions().device(device)).requires_grad_();
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  Trace run;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    at::Tensor g = at::full({3}, 0.25f * static_cast<float>(R() + 1), at::TensorOptions().device(device));
    if (step == kBadStep && R() == W() - 1) g[1] = kNan;
    scaler.scale((p * g).sum()).backward();
    run.stepped.push_back(scaler.step(opt));
    scaler.update();
    run.scales.push_back(scaler.get_scale());
  }
  return run;
}

}  // namespace

TEST(GradScalerDist, InfOnOneRankSkipsTheStepOnEveryRank) {
  GradScaler scaler(test::shared_pg(), GradScalerOptions().init_scale(1024).growth_interval(2));
  const Trace run = run_local_gradients(scaler);
  // 1024: two finite steps grow it; the bad step backs it off on every rank; then growth again.
  const std::vector<double> expected_scales{1024, 2048, 2048, 1024, 1024, 2048, 2048, 4096};
  EXPECT_EQ(run.scales, expected_scales);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(run.stepped[static_cast<size_t>(step)], step != kBadStep) << "step " << step;
    for (double s : everywhere(run.scales[static_cast<size_t>(step)])) EXPECT_EQ(s, run.scales[static_cast<size_t>(step)]);
  }
  for (double t : everywhere(static_cast<double>(scaler.growth_tracker()))) EXPECT_EQ(t, 0.0);
}

TEST(GradScalerDist, WithoutTheProcessGroupOnlyTheRankThatSawTheInfSkips) {
  // Why the all-reduce: a scaler without it decides from this rank's gradients alone.
  GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(2));
  const Trace run = run_local_gradients(scaler);
  const bool i_saw_it = R() == W() - 1;
  EXPECT_EQ(run.stepped[kBadStep], !i_saw_it);
  EXPECT_EQ(run.scales[kBadStep], i_saw_it ? 1024.0 : 4096.0);
}

TEST(GradScalerDist, UnderDdpEveryRankSkipsAndKeepsIdenticalWeights) {
  torch::nn::Linear local(4, 2);
  ddp::DistributedDataParallel model(local, test::shared_pg());
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler(test::shared_pg(), GradScalerOptions().init_scale(256).growth_interval(3));
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    at::Tensor x = at::full({2, 4}, 0.5f * static_cast<float>(R() + step + 1));
    if (step == 2 && R() == W() - 1) x[0][0] = kNan;  // one sample on one rank
    at::Tensor loss = model->forward(x).pow(2).mean();
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    EXPECT_EQ(stepped, step != 2) << "step " << step;
  }
  EXPECT_EQ(scaler.get_scale(), 256.0);  // 2 finite, backoff to 128, 3 finite: grows to 256
  for (auto& param : local->parameters()) {
    auto gathered = test::shared_pg()->all_gather(param.detach().contiguous());
    for (auto& other : gathered) EXPECT_TRUE(at::equal(other, gathered[0]));
    EXPECT_TRUE(param.detach().isfinite().all().item<bool>());
  }
}

TEST(GradScalerDistGpu, InfOnOneRankSkipsTheStepOnEveryRankOverNccl) {
  // The scale, its found_inf and the all-reduce live on the GPU (NCCL).
  if (!test::shared_pg()->has_nccl()) GTEST_SKIP() << "no CUDA device visible (or no NCCL in this build)";
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(test::shared_pg()->world().local_rank));
  GradScaler scaler(test::shared_pg(), GradScalerOptions().init_scale(1024).growth_interval(2));
  const Trace run = run_local_gradients(scaler, device);
  EXPECT_EQ(run.scales, (std::vector<double>{1024, 2048, 2048, 1024, 1024, 2048, 2048, 4096}));
  for (int step = 0; step < kSteps; ++step) EXPECT_EQ(run.stepped[static_cast<size_t>(step)], step != kBadStep);
}

int main(int argc, char** argv) { return test::distributed_test_main(argc, argv); }
