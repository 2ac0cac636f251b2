// DistributedDataParallel oracles. Every rank also trains a reference model in-process, without
// any communication, on the whole global batch; after 20 steps the DDP parameters must equal the
// reference's. Runs as a world of one and as 2 and 4 Gloo ranks under `tandem run`.
//
// The reference: the mean loss over the concatenated global batch (models without BatchNorm);
// with BatchNorm, the mean of the per-shard losses, each shard normalised by its own statistics
// as on its rank, and the running statistics taken from shard 0 — what DDP's buffer broadcast
// from rank 0 implies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <gmock/gmock.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/container/sequential.h>

#include "support/compare.h"
#include "support/distributed_main.h"
#include "support/errors.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/error.h"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

using namespace tandem;
using ddp::DistributedDataParallel;
using ddp::DistributedDataParallelOptions;
using test::global_relative_l2;
using test::max_abs_difference;

namespace {

c10::Device g_device(c10::kCPU);  // where models and batches live (the GPU tests switch it)
int W() { return test::shared_pg()->size(); }
int R() { return test::shared_pg()->rank(); }

constexpr int64_t kGlobalBatch = 24;  // divisible by 1, 2, 3 and 4 ranks
constexpr int kSteps = 20;

// ---- models --------------------------------------------------------------------------------

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t hidden = 32)
      : fc1(register_module("fc1", torch::nn::Linear(12, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, 5))) {}
  at::Tensor forward(const at::Tensor& x) { return fc3(fc2(fc1(x).relu()).relu()); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

// No conv bias before BatchNorm: BatchNorm cancels it, so its gradient is pure rounding noise,
// which Adam would amplify into arbitrary updates and no oracle could match.
struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(4))),
        fc(register_module("fc", torch::nn::Linear(4 * 4 * 4, 5))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto h = at::max_pool2d(bn(conv(x.view({-1, 1, 10, 10}))).relu(), 2);
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::Linear fc;
};
TORCH_MODULE(Cnn);

// `branch` is used only on some steps (and not on every rank in the same step).
struct BranchyImpl : torch::nn::Module {
  BranchyImpl()
      : trunk(register_module("trunk", torch::nn::Linear(12, 16))),
        branch(register_module("branch", torch::nn::Linear(16, 16))),
        head(register_module("head", torch::nn::Linear(16, 5))) {}
  at::Tensor forward(const at::Tensor& x, bool use_branch) {
    auto h = trunk(x).relu();
    if (use_branch) h = h + branch(h).tanh();
    return head(h);
  }
  torch::nn::Linear trunk, branch, head;
};
TORCH_MODULE(Branchy);

bool uses_branch(int step, int rank) { return step % 3 != 0 && (step + rank) % 2 == 0; }

// ---- data ----------------------------------------------------------------------------------

struct Batch {
  at::Tensor x, y;
};
Batch global_batch(int step, int64_t features = 12) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return {at::randn({kGlobalBatch, features}, gen).to(g_device), at::randint(0, 5, {kGlobalBatch}, gen).to(g_device)};
}
Batch shard(const Batch& b, int rank, int world) {
  const int64_t n = kGlobalBatch / world;
  return {b.x.narrow(0, rank * n, n), b.y.narrow(0, rank * n, n)};
}
at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& y) { return at::cross_entropy_loss(logits, y); }

// ---- comparing -----------------------------------------------------------------------------

double max_relative_difference(torch::nn::Module& a, torch::nn::Module& b) {
  return test::max_relative_difference(a.parameters(), b.parameters());
}
double global_relative_l2(torch::nn::Module& a, torch::nn::Module& b) {
  return test::global_relative_l2(a.parameters(), b.parameters());
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<at::Tensor> params) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
}

// ---- the oracle run ------------------------------------------------------------------------

enum class Hook { None, AllReduce, Fp16, Bf16 };
struct Variant {
  std::string name;
  DistributedDataParallelOptions options;
  Hook hook = Hook::None;
  double tolerance = 1e-5;
  bool l2_metric = false;  // global_relative_l2 instead of the per-tensor maximum
};

template <typename Model>
void install_hook(Hook hook, Model& model) {
  if (hook == Hook::AllReduce) model->register_comm_hook(ddp::allreduce_hook(test::shared_pg()));
  if (hook == Hook::Fp16) model->register_comm_hook(ddp::fp16_compress_hook(test::shared_pg()));
  if (hook == Hook::Bf16) model->register_comm_hook(ddp::bf16_compress_hook(test::shared_pg()));
}

// Trains DDP(model) and a reference copy for kSteps and returns the worst relative difference.
template <typename Holder, typename Forward>
double train_against_reference(const Variant& v, const std::string& opt_kind, bool per_shard_reference,
                               Forward forward, int64_t features = 12) {
  torch::manual_seed(1);
  Holder reference;  // rank 0's initial weights: DDP must broadcast them
  torch::manual_seed(1 + R());
  Holder local;
  reference->to(g_device);
  local->to(g_device);
  DistributedDataParallel model(local, test::shared_pg(), v.options);
  install_hook(v.hook, model);

  auto ddp_opt = make_optimizer(opt_kind, model->parameters());
  auto ref_opt = make_optimizer(opt_kind, reference->parameters());
  for (int step = 0; step < kSteps; ++step) {
    Batch batch = global_batch(step, features);
    Batch mine = shard(batch, R(), W());
    ddp_opt->zero_grad();
    loss_of(forward(*model, mine.x, step, R()), mine.y).backward();
    ddp_opt->step();

    ref_opt->zero_grad();
    if (per_shard_reference) {
      at::Tensor total;
      std::vector<at::Tensor> saved;
      for (int k = 0; k < W(); ++k) {
        if (k == 1) {  // running statistics: shard 0's update only
          for (auto& b : reference->buffers()) saved.push_back(b.clone());
        }
        Batch s = shard(batch, k, W());
        at::Tensor l = loss_of(forward(*reference, s.x, step, k), s.y) / W();
        total = total.defined() ? total + l : l;
      }
      total.backward();  // before restoring: BatchNorm's backward saved the buffers
      if (!saved.empty()) {
        at::NoGradGuard no_grad;
        auto buffers = reference->buffers();
        for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
      }
    } else {
      loss_of(forward(*reference, batch.x, step, -1), batch.y).backward();
    }
    ref_opt->step();
  }
  if (!v.options.find_unused_parameters() || v.options.static_graph()) {
    EXPECT_EQ(model->reducer().bucket_builds(), 2) << "buckets were not rebuilt after the first iteration";
  }
  if (R() == 0) {  // BatchNorm statistics: rank 0's, which the reference reproduces from shard 0
    std::vector<at::Tensor> mine = model->module()->buffers(), theirs = reference->buffers();
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_LE(max_abs_difference(mine[i], theirs[i]), std::max(1e-4, v.tolerance)) << "buffer " << i;
  }
  return v.l2_metric ? global_relative_l2(*model->module(), *reference)
                    : max_relative_difference(*model->module(), *reference);
}

std::vector<Variant> variants() {
  using O = DistributedDataParallelOptions;
  return {
      {"defaults", O()},
      {"bucket_view", O().gradient_as_bucket_view(true)},
      {"tiny_buckets", O().bucket_cap_mb(0.0005).first_bucket_mb(0.0001)},
      {"tiny_buckets_view", O().bucket_cap_mb(0.0005).first_bucket_mb(0.0001).gradient_as_bucket_view(true)},
      {"one_giant_bucket", O().bucket_cap_mb(1e6).first_bucket_mb(1e6)},
      {"find_unused", O().find_unused_parameters(true)},
      {"static_graph", O().static_graph(true)},
      {"allreduce_hook", O(), Hook::AllReduce},
  };
}

// Compression hooks round every gradient to 16 bits: a looser tolerance, and SGD only. Under
// Adam the comparison with an fp32 reference is dominated by Adam dividing near-zero gradients
// by their own tiny norms, which turns rounding into O(1) relative changes of those weights.
// bf16 keeps 8 bits, and the order of the sum matters after 20 steps: the CNN on 4 ranks ends
// 0.021-0.026 away with ring orders (Gloo; Open MPI's ring) and 0.065-0.069 with tree orders
// (Open MPI's recursive doubling and Rabenseifner, its defaults here). The sum itself is checked
// within rounding bounds of the exact one on every backend (collectives_test).
std::vector<Variant> compression_variants() {
  using O = DistributedDataParallelOptions;
  return {{"fp16_hook", O(), Hook::Fp16, 5e-2, true},
          {"bf16_hook", O().gradient_as_bucket_view(true), Hook::Bf16, 1e-1, true}};
}

struct Case {
  std::string model, optimizer;
  Variant variant;
};
void PrintTo(const Case& c, std::ostream* out) { *out << c.model << "_" << c.optimizer << "_" << c.variant.name; }

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* model : {"mlp", "cnn"}) {
    for (const char* opt : {"sgd", "adam"}) {
      for (const auto& v : variants()) out.push_back({model, opt, v});
    }
    for (const auto& v : compression_variants()) out.push_back({model, "sgd", v});
  }
  using O = DistributedDataParallelOptions;
  out.push_back({"branchy", "sgd", {"find_unused_fp16", O().find_unused_parameters(true), Hook::Fp16, 5e-3, true}});
  for (const char* opt : {"sgd", "adam"}) {
    out.push_back({"branchy", opt, {"find_unused", O().find_unused_parameters(true)}});
    out.push_back({"branchy", opt, {"find_unused_view", O().find_unused_parameters(true).gradient_as_bucket_view(true)}});
    out.push_back({"branchy", opt, {"find_unused_tiny", O().find_unused_parameters(true).bucket_cap_mb(0.0005).first_bucket_mb(0.0001)}});
  }
  return out;
}

class DdpOracle : public ::testing::TestWithParam<Case> {};

TEST_P(DdpOracle, ParametersAfter20StepsEqualTheSingleProcessRun) {
  const Case& c = GetParam();
  double diff = 0;
  if (c.model == "mlp") {
    diff = train_against_reference<Mlp>(c.variant, c.optimizer, false,
                                        [](auto& m, const at::Tensor& x, int, int) { return m.forward(x); });
  } else if (c.model == "cnn") {
    diff = train_against_reference<Cnn>(c.variant, c.optimizer, true,
                                        [](auto& m, const at::Tensor& x, int, int) { return m.forward(x); }, 100);
  } else {
    // rank -1 is the reference on the whole batch: each shard's rows use the branch as that rank does.
    diff = train_against_reference<Branchy>(c.variant, c.optimizer, true,
                                            [](auto& m, const at::Tensor& x, int step, int rank) {
                                              return m.forward(x, uses_branch(step, rank));
                                            });
  }
  std::printf("oracle %s/%s/%s on %d ranks: %s %.3g (tolerance %.0e)\n", c.model.c_str(), c.optimizer.c_str(),
              c.variant.name.c_str(), W(), c.variant.l2_metric ? "relative L2 difference" : "max relative difference",
              diff, c.variant.tolerance);
  EXPECT_LE(diff, c.variant.tolerance);
}

INSTANTIATE_TEST_SUITE_P(Table, DdpOracle, ::testing::ValuesIn(cases()), [](const auto& info) {
  return info.param.model + "_" + info.param.optimizer + "_" + info.param.variant.name;
});

// ---- GPU: the same oracles on CUDA with NCCL (skipped visibly without a GPU) -------------------

TEST(DdpGpu, OraclesOnCuda) {
  if (!test::every_rank_has_nccl()) GTEST_SKIP() << test::why_no_nccl();
  g_device = *test::shared_pg()->cuda_device();  // cuda:LOCAL_RANK (Note [Device binding])
  ASSERT_EQ(g_device.index(), test::shared_pg()->world().local_rank);
  using O = DistributedDataParallelOptions;
  for (const Variant& v : {Variant{"defaults", O()}, Variant{"bucket_view", O().gradient_as_bucket_view(true)},
                           Variant{"tiny_buckets", O().bucket_cap_mb(0.0005).first_bucket_mb(0.0001)},
                           Variant{"allreduce_hook", O(), Hook::AllReduce},
                           Variant{"bf16_hook", O(), Hook::Bf16, 5e-2, true}}) {
    for (const char* opt : {"sgd", "adam"}) {
      const uint64_t before = test::shared_pg()->last_sequence_number();
      const double diff = train_against_reference<Mlp>(v, opt, false, [](auto& m, const at::Tensor& x, int, int) {
        return m.forward(x);
      });
      const uint64_t collectives = test::shared_pg()->last_sequence_number() - before;
      std::printf("gpu oracle mlp/%s/%s on %d ranks: %.3g (tolerance %.0e), %llu collectives\n", opt, v.name.c_str(),
                  W(), diff, v.tolerance, static_cast<unsigned long long>(collectives));
      EXPECT_LE(diff, v.tolerance) << v.name << " " << opt;
      // A hook always reduces, even in a world of one: that is how a single GPU reaches NCCL.
      if (v.hook != Hook::None || W() > 1) {
        EXPECT_GE(collectives, static_cast<uint64_t>(kSteps)) << v.name;
      }
    }
  }
  g_device = c10::Device(c10::kCPU);
}

#ifdef TANDEM_HAVE_CUDA
// The pre-division (and everything else the reducer does per gradient) allocates nothing on the
// device: a DDP step makes as many CUDA allocations as the same step without DDP, give or take a
// few per step, never one per parameter. Counted by the caching allocator, which sees every request.
int64_t cuda_allocations(c10::DeviceIndex device) {
  using c10::CachingDeviceAllocator::StatType;
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocation[static_cast<size_t>(StatType::AGGREGATE)].allocated;
}

TEST(DdpGpu, NoDeviceAllocationPerGradient) {
  if (!test::every_rank_has_nccl()) GTEST_SKIP() << test::why_no_nccl();
  const c10::Device device = *test::shared_pg()->cuda_device();
  constexpr int kLayers = 24, kMeasured = 5;  // 48 parameters
  auto build = [&] {
    torch::nn::Sequential net;
    for (int i = 0; i < kLayers; ++i) net->push_back(torch::nn::Linear(16, 16));
    net->to(device);
    return net;
  };
  const at::Tensor x = at::randn({8, 16}, at::TensorOptions().device(device));
  auto per_step = [&](auto& model, auto& params) {
    torch::optim::SGD opt(params, 0.01);
    auto step = [&] {
      opt.zero_grad();
      model->forward(x).square().mean().backward();
      opt.step();
    };
    for (int i = 0; i < 3; ++i) step();  // first-iteration work (bucket rebuild, gradients) done
    c10::cuda::device_synchronize();
    const int64_t before = cuda_allocations(device.index());
    for (int i = 0; i < kMeasured; ++i) step();
    c10::cuda::device_synchronize();
    return double(cuda_allocations(device.index()) - before) / kMeasured;
  };
  auto plain = build();
  auto plain_params = plain->parameters();
  const double without_ddp = per_step(plain, plain_params);
  DistributedDataParallel ddp_model(build(), test::shared_pg());
  // A world of one without a hook has no buckets (Note [World of one]): the allreduce hook makes
  // it copy every gradient into its bucket and reduce through NCCL, as N ranks do without the
  // pre-division, which only N >= 2 ranks reach (gpu.ddp.ranks2).
  if (W() == 1) ddp_model->register_comm_hook(ddp::allreduce_hook(test::shared_pg()));
  auto ddp_params = ddp_model->parameters();
  const double with_ddp = per_step(ddp_model, ddp_params);
  std::printf("cuda allocations per step on %d ranks: %.1f without DDP, %.1f with DDP %s (%d parameters)\n", W(),
              without_ddp, with_ddp, W() == 1 ? "and the allreduce hook" : "(pre-division)", 2 * kLayers);
  EXPECT_LT(with_ddp - without_ddp, kLayers) << "the reducer allocates on the device per gradient";
}
#endif

// ---- uneven inputs: join() (Note [Join]) ------------------------------------------------------
// Rank r has 3 + 2r batches of its own. The reference trains one model in-process on every
// rank's batches: at each step, the sum over the ranks that still have data of their gradient,
// divided by the world size (PyTorch's divide_by_initial_world_size). After join() every rank
// must hold the reference's weights, bit for bit the same on every rank.

int batches_of(int rank) { return 3 + 2 * rank; }
Batch own_batch(int rank, int step, int micro) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5000 + 100 * rank + 2 * step + micro);
  return {at::randn({6, 12}, gen), at::randint(0, 5, {6}, gen)};
}

struct JoinCase {
  std::string name;
  DistributedDataParallelOptions options;
  bool accumulate = false;  // a no_sync micro-batch before each synced one
};

class DdpJoin : public ::testing::TestWithParam<JoinCase> {};

TEST_P(DdpJoin, UnevenInputsEqualTheReference) {
  const JoinCase& c = GetParam();
  torch::manual_seed(7);
  Mlp local;
  torch::manual_seed(7);
  Mlp reference;
  auto model = DistributedDataParallel(local, test::shared_pg(), c.options);
  torch::optim::SGD sgd(model->parameters(), 0.05);
  torch::optim::SGD reference_sgd(reference->parameters(), 0.05);

  const int mine = batches_of(R());
  const int64_t shadowed = model->join([&] {
    for (int step = 0; step < mine; ++step) {
      sgd.zero_grad();
      if (c.accumulate) {
        auto guard = model->no_sync();
        Batch b = own_batch(R(), step, 0);
        loss_of(model->forward(b.x), b.y).backward();
      }
      Batch b = own_batch(R(), step, 1);
      loss_of(model->forward(b.x), b.y).backward();
      sgd.step();
    }
  });
  const int longest = batches_of(W() - 1);
  EXPECT_EQ(shadowed, longest - mine) << "iterations this rank stood in for";

  for (int step = 0; step < longest; ++step) {
    reference_sgd.zero_grad();
    for (int r = 0; r < W(); ++r) {
      if (step >= batches_of(r)) continue;  // out of data: contributes zero, still counted in W
      for (int micro = c.accumulate ? 0 : 1; micro < 2; ++micro) {
        Batch b = own_batch(r, step, micro);
        (loss_of(reference->forward(b.x), b.y) / W()).backward();
      }
    }
    reference_sgd.step();
  }
  const double diff = max_relative_difference(*model->module(), *reference);
  std::printf("join/%s on %d ranks (%d..%d batches): max relative difference %.3g\n", c.name.c_str(), W(),
              batches_of(0), longest, diff);
  EXPECT_LT(diff, 1e-5);
  std::vector<at::Tensor> flat;
  for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
  auto everywhere = test::shared_pg()->all_gather(at::cat(flat));
  for (int r = 1; r < W(); ++r) EXPECT_TRUE(at::equal(everywhere[0], everywhere[r])) << "rank " << r << " differs";
}

// BatchNorm under join(): before each synced forward the buffers come from the highest rank still
// training (PyTorch's choice), which here is always the last rank (it has the most batches); the
// final sync hands its buffers to everyone. So the running statistics must equal those of a
// reference that saw only the last rank's batches, while the parameters see every rank's.
TEST(DdpJoinBuffers, RunningStatisticsFollowARankStillTraining) {
  auto batch_of = [](int rank, int step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7000 + 100 * rank + step);
    return Batch{at::randn({6, 100}, gen), at::randint(0, 5, {6}, gen)};
  };
  torch::manual_seed(3);
  Cnn local;
  torch::manual_seed(3);
  Cnn reference;
  auto model = DistributedDataParallel(local, test::shared_pg());
  torch::optim::SGD sgd(model->parameters(), 0.05);
  torch::optim::SGD reference_sgd(reference->parameters(), 0.05);
  const int mine = batches_of(R()), longest = batches_of(W() - 1);
  model->join([&] {
    for (int step = 0; step < mine; ++step) {
      sgd.zero_grad();
      Batch b = batch_of(R(), step);
      loss_of(model->forward(b.x), b.y).backward();
      sgd.step();
    }
  });
  for (int step = 0; step < longest; ++step) {
    reference_sgd.zero_grad();
    for (int r = 0; r < W(); ++r) {
      if (step >= batches_of(r)) continue;
      std::vector<at::Tensor> kept;  // only the last rank's forwards move the statistics
      for (const auto& buffer : reference->buffers()) kept.push_back(buffer.clone());
      Batch b = batch_of(r, step);
      (loss_of(reference->forward(b.x), b.y) / W()).backward();
      if (r != W() - 1) {
        at::NoGradGuard no_grad;
        auto buffers = reference->buffers();
        for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(kept[i]);
      }
    }
    reference_sgd.step();
  }
  auto as_double = [](std::vector<at::Tensor> tensors) {
    for (auto& t : tensors) t = t.detach().to(at::kDouble);
    return tensors;
  };
  const double parameters = max_relative_difference(*model->module(), *reference);
  const double buffers = test::max_relative_difference(as_double(model->module()->buffers()), as_double(reference->buffers()));
  std::printf("join/batchnorm on %d ranks: parameters %.3g, running statistics %.3g\n", W(), parameters, buffers);
  EXPECT_LT(parameters, 1e-5);
  EXPECT_LT(buffers, 1e-5);
}

std::vector<JoinCase> join_cases() {
  return {{"default", DistributedDataParallelOptions()},
          {"small_buckets_views", DistributedDataParallelOptions().bucket_cap_mb(0.002).gradient_as_bucket_view(true)},
          {"find_unused", DistributedDataParallelOptions().find_unused_parameters(true)},
          {"no_sync_accumulation", DistributedDataParallelOptions().bucket_cap_mb(0.002), true}};
}

INSTANTIATE_TEST_SUITE_P(Cases, DdpJoin, ::testing::ValuesIn(join_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- no_sync ---------------------------------------------------------------------------------

TEST(DdpNoSync, GradientsDifferInsideAndAgreeAfterTheNextSyncedStep) {
  torch::manual_seed(1);
  Mlp reference;
  torch::manual_seed(1);
  Mlp local;
  DistributedDataParallel model(local, test::shared_pg());
  Batch b1 = global_batch(1), b2 = global_batch(2);
  {
    auto guard = model->no_sync();
    Batch mine = shard(b1, R(), W());
    loss_of(model->forward(mine.x), mine.y).backward();
  }
  at::Tensor g = model->module()->fc1->weight.grad().clone();
  auto all = test::shared_pg()->all_gather(g);
  for (int r = 1; r < W(); ++r) EXPECT_FALSE(at::equal(all[0], all[r])) << "no_sync still synchronised";

  Batch mine = shard(b2, R(), W());
  loss_of(model->forward(mine.x), mine.y).backward();
  // Reference: both steps' per-shard gradients, accumulated and averaged.
  for (const Batch* b : {&b1, &b2}) {
    for (int k = 0; k < W(); ++k) {
      Batch s = shard(*b, k, W());
      (loss_of(reference->forward(s.x), s.y) / W()).backward();
    }
  }
  auto ddp_params = model->module()->parameters(), ref_params = reference->parameters();
  for (size_t i = 0; i < ddp_params.size(); ++i) {
    at::Tensor grad = ddp_params[i].grad();
    auto everywhere = test::shared_pg()->all_gather(grad.contiguous());
    for (int r = 1; r < W(); ++r) EXPECT_TRUE(at::equal(everywhere[0], everywhere[r]));
    const double scale = std::max(ref_params[i].grad().abs().max().item<double>(), 1e-12);
    EXPECT_LE((grad - ref_params[i].grad()).abs().max().item<double>() / scale, 1e-5);
  }
}

// ---- gradient_as_bucket_view -----------------------------------------------------------------

TEST(DdpBucketView, GradientsAreViewsOfTheBucketsAndAddNoMemory) {
  if (W() == 1) GTEST_SKIP() << "a world of one has no buckets (DdpWorldOfOne covers it)";
  for (bool views : {false, true}) {
    torch::manual_seed(1);
    Mlp local;
    DistributedDataParallel model(local, test::shared_pg(), DistributedDataParallelOptions().gradient_as_bucket_view(views));
    torch::optim::SGD opt(model->parameters(), 0.01);
    std::vector<const void*> first_pointers;
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad(/*set_to_none=*/false);  // keep the views across steps
      Batch mine = shard(global_batch(step), R(), W());
      loss_of(model->forward(mine.x), mine.y).backward();
      opt.step();
    }
    int64_t bucket_bytes = 0, grad_bytes_outside_buckets = 0;
    const auto& buckets = model->reducer().buckets();
    for (const auto& b : buckets) bucket_bytes += b.contents.numel() * b.contents.element_size();
    for (const auto& p : model->module()->parameters()) {
      const at::Tensor& g = p.grad();
      bool inside = false;
      for (const auto& b : buckets) {
        if (g.is_alias_of(b.contents)) {
          const auto* lo = static_cast<const char*>(b.contents.data_ptr());
          const auto* at_ = static_cast<const char*>(g.data_ptr());
          inside = at_ >= lo && at_ + g.numel() * g.element_size() <= lo + b.contents.numel() * b.contents.element_size();
        }
      }
      EXPECT_EQ(inside, views) << "param.grad and its bucket " << (views ? "must" : "must not") << " share storage";
      if (!inside) grad_bytes_outside_buckets += g.numel() * g.element_size();
    }
    // The memory gradients take on top of the buckets: none with views, one full copy without.
    std::printf("bucket_view=%d: bucket bytes %lld, gradient bytes outside buckets %lld\n", views,
                static_cast<long long>(bucket_bytes), static_cast<long long>(grad_bytes_outside_buckets));
    EXPECT_EQ(grad_bytes_outside_buckets, views ? 0 : bucket_bytes);
  }
}

// ---- hooks ----------------------------------------------------------------------------------

TEST(DdpHooks, DestroyingDdpRemovesItsHooks) {
  Mlp local;
  auto hooks = [&] {
    size_t n = 0;
    for (const auto& p : local->parameters()) n += torch::autograd::impl::grad_accumulator(p)->post_hooks().size();
    return n;
  };
  {
    DistributedDataParallel model(local, test::shared_pg());
    EXPECT_EQ(hooks(), local->parameters().size());  // one per parameter
    Batch mine = shard(global_batch(0), R(), W());
    loss_of(model->forward(mine.x), mine.y).backward();
  }
  EXPECT_EQ(hooks(), 0u);
  // The bare module trains alone afterwards: its backward involves no reducer.
  Batch mine = shard(global_batch(1), R(), W());
  local->zero_grad();
  loss_of(local->forward(mine.x), mine.y).backward();
  EXPECT_TRUE(local->fc1->weight.grad().defined());
}

// ---- errors that every rank hits together -----------------------------------------------------

TEST(DdpErrors, ModelsThatDifferAcrossRanksAreNamed) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  Mlp local(R() == 1 ? 33 : 32);
  try {
    DistributedDataParallel model(local, test::shared_pg());
    FAIL() << "mismatched models accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "DDP: ranks hold different models: parameter 0 ('module.fc1.weight' here) is "
                           "Float[32, 12] on cpu on rank 0 but Float[33, 12] on cpu on rank 1");
  }
}

TEST(DdpErrors, ADifferentParameterCountIsNamed) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  torch::nn::Sequential net(torch::nn::Linear(2, 2));
  if (R() == 1) net->push_back(torch::nn::Linear(2, 2));
  EXPECT_ERROR(DistributedDataParallel(net, test::shared_pg()),
               "DDP: ranks hold different models: rank 0 has 2 parameters that require gradients, rank 1 has 4");
}

// Agreement before waiting: DDP objects with other options on some ranks (the buckets would differ,
// and the all-reduces with them) stop every rank at once, naming the option, the values and ranks.
TEST(DdpErrors, OptionsThatDifferBetweenRanksAreOneLineOnEveryRank) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  std::string others = W() == 2 ? "rank 1" : "ranks 1";
  for (int r = 2; r < W(); ++r) others += ", " + std::to_string(r);
  torch::nn::Sequential net(torch::nn::Linear(2, 2));
  EXPECT_ERROR(DistributedDataParallel(net, test::shared_pg(),
                                       DistributedDataParallelOptions().find_unused_parameters(R() == 0)),
               "ddp: the DistributedDataParallel being made: the ranks of the world group disagree on "
               "find_unused_parameters: true on rank 0; false on " + others);
}

TEST(DdpErrors, AParameterOnAnotherDeviceIsNamed) {
  torch::nn::Sequential net(torch::nn::Linear(2, 2));
  net->register_parameter("stray", at::zeros({2}, at::TensorOptions().device(at::kMeta)));
  EXPECT_ERROR(DistributedDataParallel(net, test::shared_pg()),
               "DDP: 'module.stray' is on meta; DDP needs the module on one cpu or cuda device");
}

TEST(DdpErrors, AnUnusedParameterWithoutFindUnusedIsNamed) {
  torch::manual_seed(1);
  Branchy local;
  DistributedDataParallel model(local, test::shared_pg());
  Batch mine = shard(global_batch(0), R(), W());
  try {
    loss_of(model->forward(mine.x, false), mine.y).backward();
    FAIL() << "incomplete reduction accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("these parameters received no gradient in this backward: 2 "
                                         "'module.branch.weight', 3 'module.branch.bias'"),
              std::string::npos)
        << e.what();
  }
  // The reducer recovered: a full iteration works afterwards.
  loss_of(model->forward(mine.x, true), mine.y).backward();
}

TEST(DdpErrors, ASecondForwardBeforeBackwardIsAnError) {
  Mlp local;
  DistributedDataParallel model(local, test::shared_pg());
  Batch mine = shard(global_batch(0), R(), W());
  auto out = model->forward(mine.x);
  try {
    model->forward(mine.x);
    FAIL() << "second forward accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "DDP: forward() was called again before the last synced forward's backward() started: "
                           "call backward() once per synced forward(), or run extra forwards under "
                           "at::NoGradGuard or inside no_sync()");
  }
  {
    at::NoGradGuard no_grad;  // evaluation forwards never interfere
    model->forward(mine.x);
  }
  loss_of(out, mine.y).backward();
}



// ---- a backward that raises (Note [Failed backward]) ------------------------------------------

bool g_fail_backward = false;  // set for one step; every rank raises at the same point

// Identity forward; its backward raises while g_fail_backward is set.
struct FailingBackward : torch::autograd::Function<FailingBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    if (g_fail_backward) throw std::runtime_error("injected failure in backward");
    return {grads[0]};
  }
};

// `failing_layer` 1: between fc1 and fc2, so fc3's and fc2's gradients (and their buckets) come
// first; 3: on the output, so backward raises before any parameter has a gradient.
struct FlakyMlpImpl : torch::nn::Module {
  explicit FlakyMlpImpl(int failing_layer = 1)
      : failing_layer(failing_layer),
        fc1(register_module("fc1", torch::nn::Linear(12, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, 32))),
        fc3(register_module("fc3", torch::nn::Linear(32, 5))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = fc1(x).relu();
    if (failing_layer == 1) h = FailingBackward::apply(h);
    at::Tensor out = fc3(fc2(h).relu());
    return failing_layer == 3 ? FailingBackward::apply(out) : out;
  }
  int failing_layer;
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(FlakyMlp);

struct FailureCase {
  std::string name;
  int failing_layer;
  DistributedDataParallelOptions options;
};
void PrintTo(const FailureCase& c, std::ostream* out) { *out << c.name; }
class DdpFailedBackward : public ::testing::TestWithParam<FailureCase> {};

// Every rank raises inside backward at step 3; the loop catches it and goes on. The result must
// equal a single-process run on the global batches that skips step 3.
TEST_P(DdpFailedBackward, TrainingGoesOnAndEqualsARunThatSkippedTheStep) {
  constexpr int kFailingStep = 3;
  const auto& c = GetParam();
  torch::manual_seed(1);
  FlakyMlp reference(c.failing_layer);
  torch::manual_seed(1 + R());
  FlakyMlp local(c.failing_layer);
  DistributedDataParallel model(local, test::shared_pg(), c.options);
  torch::optim::SGD ddp_opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::vector<std::string> caught;
  for (int step = 0; step < 8; ++step) {
    Batch batch = global_batch(step);
    Batch mine = shard(batch, R(), W());
    ddp_opt.zero_grad();
    at::Tensor loss = loss_of(model->forward(mine.x), mine.y);
    g_fail_backward = step == kFailingStep;
    try {
      loss.backward();
    } catch (const std::exception& e) {
      caught.push_back(one_line(e));
      g_fail_backward = false;
      continue;  // no optimizer step
    }
    ddp_opt.step();
    if (step == kFailingStep) continue;
    ref_opt.zero_grad();
    loss_of(reference->forward(batch.x), batch.y).backward();
    ref_opt.step();
  }
  ASSERT_EQ(caught.size(), 1u);
  EXPECT_THAT(caught[0], ::testing::HasSubstr("injected failure in backward"));  // the user's own error
  EXPECT_EQ(model->reducer().failed_iterations(), 1);
  const double diff = max_relative_difference(*model->module(), *reference);
  std::printf("failed backward %s on %d ranks: max relative difference %.3g after skipping step %d\n",
              c.name.c_str(), W(), diff, kFailingStep);
  EXPECT_LE(diff, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Table, DdpFailedBackward,
    ::testing::Values(
        FailureCase{"mid_model_tiny_buckets", 1, DistributedDataParallelOptions().bucket_cap_mb(0.002).first_bucket_mb(0.0005)},
        FailureCase{"mid_model_bucket_view", 1,
                    DistributedDataParallelOptions().bucket_cap_mb(0.002).first_bucket_mb(0.0005).gradient_as_bucket_view(true)},
        FailureCase{"mid_model_find_unused", 1, DistributedDataParallelOptions().find_unused_parameters(true)},
        FailureCase{"before_any_gradient", 3, DistributedDataParallelOptions()}),
    [](const auto& info) { return info.param.name; });

// A hook whose reduction fails, on a backward that also leaves parameters without gradient: the
// error names both, the communication failure is not swallowed.
TEST(DdpErrors, ACommunicationFailureOnTheMissingGradientPathIsReported) {
  struct Failing : ddp::PendingReduction {
    at::Tensor wait() override { throw Error("injected all-reduce failure"); }
  };
  torch::manual_seed(1);
  Branchy local;
  // A bucket per parameter: the head's buckets are launched before the branch's stay incomplete.
  DistributedDataParallel model(local, test::shared_pg(), DistributedDataParallelOptions().bucket_cap_mb(1e-5).first_bucket_mb(1e-6));
  model->register_comm_hook([](ddp::GradBucket&) -> std::unique_ptr<ddp::PendingReduction> { return std::make_unique<Failing>(); });
  Batch mine = shard(global_batch(0), R(), W());
  const std::string error = test::error_of([&] { loss_of(model->forward(mine.x, false), mine.y).backward(); });
  EXPECT_THAT(error, ::testing::HasSubstr("these parameters received no gradient in this backward: 2 'module.branch.weight'"));
  EXPECT_THAT(error, ::testing::HasSubstr("finishing the all-reduces already started failed too: injected all-reduce failure"));
}

// Only some ranks miss a gradient (a data-dependent branch): they contribute zeros so every
// bucket is still launched, report the error, and the next iteration is in step everywhere.
TEST(DdpErrors, AGradientMissingOnSomeRanksKeepsTheCollectivesInStep) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  torch::manual_seed(1);
  Branchy local;
  DistributedDataParallel model(local, test::shared_pg(), DistributedDataParallelOptions().bucket_cap_mb(1e-5).first_bucket_mb(1e-6));
  Batch mine = shard(global_batch(0), R(), W());
  const std::string error = test::error_of([&] { loss_of(model->forward(mine.x, R() == 0), mine.y).backward(); });
  if (R() == 0) {
    EXPECT_EQ(error, "(nothing thrown)");
  } else {
    EXPECT_THAT(error, ::testing::HasSubstr("these parameters received no gradient in this backward: 2 'module.branch.weight'"));
  }
  model->zero_grad();
  loss_of(model->forward(mine.x, true), mine.y).backward();
  auto everywhere = test::shared_pg()->all_gather(local->head->weight.grad().contiguous());
  for (int r = 1; r < W(); ++r) EXPECT_TRUE(at::equal(everywhere[0], everywhere[r]));
}

// ---- "used" means autograd produced the gradient ---------------------------------------------

// With find_unused_parameters, a layer that no rank uses keeps whatever gradient each rank left
// in it (PyTorch leaves globally unused gradients alone), also when gradients are bucket views.
TEST(DdpUnused, StaleGradientsOfAGloballyUnusedLayerStayAsEachRankLeftThem) {
  for (bool views : {false, true}) {
    torch::manual_seed(1);
    Branchy local;
    DistributedDataParallel model(local, test::shared_pg(),
                                  DistributedDataParallelOptions().find_unused_parameters(true).gradient_as_bucket_view(views));
    torch::optim::SGD opt(model->parameters(), 0.01);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad(/*set_to_none=*/false);
      const bool use_branch = step == 0;  // afterwards, no rank uses the branch
      std::vector<at::Tensor> stale;
      if (!use_branch) {
        at::NoGradGuard no_grad;
        for (auto* p : {&local->branch->weight, &local->branch->bias}) {
          p->mutable_grad().fill_(R() + 1.5 + step);  // rank-dependent: an average would change it
          stale.push_back(p->grad().clone());
        }
      }
      Batch mine = shard(global_batch(step), R(), W());
      loss_of(model->forward(mine.x, use_branch), mine.y).backward();
      if (!use_branch) {
        EXPECT_TRUE(at::equal(local->branch->weight.grad(), stale[0])) << "views=" << views << " step " << step;
        EXPECT_TRUE(at::equal(local->branch->bias.grad(), stale[1])) << "views=" << views << " step " << step;
      }
      // The used layers hold the average: the same on every rank.
      auto everywhere = test::shared_pg()->all_gather(local->head->weight.grad().contiguous());
      for (int r = 1; r < W(); ++r) EXPECT_TRUE(at::equal(everywhere[0], everywhere[r]));
      opt.step();
    }
  }
}

// ---- outputs DDP cannot look into ------------------------------------------------------------

struct Prediction {
  at::Tensor logits;
};
struct OpaqueImpl : torch::nn::Module {
  OpaqueImpl() : fc(register_module("fc", torch::nn::Linear(12, 5))) {}
  Prediction forward(const at::Tensor& x) { return {fc(x)}; }
  torch::nn::Linear fc;
};
TORCH_MODULE(Opaque);

TEST(DdpErrors, AnOutputDdpCannotLookIntoIsNamedWhenFindUnusedNeedsIt) {
  Batch mine = shard(global_batch(0), R(), W());
  {
    Opaque local;
    DistributedDataParallel model(local, test::shared_pg(), DistributedDataParallelOptions().find_unused_parameters(true));
    EXPECT_ERROR(model->forward(mine.x),
                 "DDP: find_unused_parameters needs every tensor of forward()'s output, but DDP cannot look inside a "
                 "value of type '(anonymous namespace)::Prediction': return a tensor, or a std::vector, std::tuple, "
                 "std::pair or std::optional of them");
  }
  Opaque local;  // without the search, any output type trains
  DistributedDataParallel model(local, test::shared_pg());
  loss_of(model->forward(mine.x).logits, mine.y).backward();
  EXPECT_TRUE(local->fc->weight.grad().defined());
}

// ---- a world of one (Note [World of one]) ------------------------------------------------------

TEST(DdpWorldOfOne, NoBucketIsAllocatedAndGradientsStayWhereAutogradPutThem) {
  if (W() != 1) GTEST_SKIP() << "a world of one only";
  for (bool views : {false, true}) {
    torch::manual_seed(1);
    Mlp local;
    DistributedDataParallel model(local, test::shared_pg(), DistributedDataParallelOptions().gradient_as_bucket_view(views));
    torch::optim::SGD opt(model->parameters(), 0.01);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      Batch mine = shard(global_batch(step), R(), W());
      loss_of(model->forward(mine.x), mine.y).backward();
      opt.step();
    }
    for (const auto& b : model->reducer().buckets()) EXPECT_FALSE(b.contents.defined());
  }
  // A communication hook still sees every bucket (so the world-of-one GPU test reaches NCCL).
  Mlp local;
  DistributedDataParallel model(local, test::shared_pg());
  size_t calls = 0;
  auto allreduce = ddp::allreduce_hook(test::shared_pg());
  model->register_comm_hook([&](ddp::GradBucket& bucket) {
    ++calls;
    return allreduce(bucket);
  });
  Batch mine = shard(global_batch(0), R(), W());
  loss_of(model->forward(mine.x), mine.y).backward();
  EXPECT_EQ(calls, model->reducer().buckets().size());
  for (const auto& b : model->reducer().buckets()) EXPECT_TRUE(b.contents.defined());
}

}  // namespace

// Failure scenarios, run under `tandem run` by tests/expect_failure.sh: the error must reach the
// launcher as a non-zero exit and a clear line, never a hang.
int main(int argc, char** argv) {
  test::Scenarios scenarios;
  scenarios["skip-backward-on-rank-1"] = [] {
    Mlp local;
    DistributedDataParallel model(local, test::shared_pg());
    Batch mine = shard(global_batch(0), R(), W());
    auto loss = loss_of(model->forward(mine.x), mine.y);
    if (R() != 1) loss.backward();  // rank 0 waits in the all-reduce that rank 1 never joins
    model->forward(mine.x);         // rank 1: error
    return 0;
  };
  scenarios["mismatched-models"] = [] {
    Mlp local(R() == 1 ? 40 : 32);
    DistributedDataParallel model(local, test::shared_pg());
    return 0;
  };
  // Rank 1's backward raises alone; every rank's loop catches errors of backward and goes on.
  scenarios["raise-alone-on-rank-1"] = [] {
    FlakyMlp local(1);
    DistributedDataParallel model(local, test::shared_pg(), DistributedDataParallelOptions().bucket_cap_mb(0.002).first_bucket_mb(0.0005));
    for (int step = 0; step < 6; ++step) {
      Batch mine = shard(global_batch(step), R(), W());
      model->zero_grad();
      at::Tensor loss = loss_of(model->forward(mine.x), mine.y);
      g_fail_backward = step == 2 && R() == 1;
      try {
        loss.backward();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: step %d: backward failed: %s\n", R(), step, one_line(e).c_str());
      }
    }
    return 0;
  };
  return test::distributed_test_main(argc, argv, scenarios);
}
