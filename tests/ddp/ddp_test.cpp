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

#include "tandem/comm/process_group.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/error.h"

using namespace tandem;
using ddp::DistributedDataParallel;
using ddp::DistributedDataParallelOptions;

namespace {

std::shared_ptr<comm::ProcessGroup> g_pg;
c10::Device g_device(c10::kCPU);  // where models and batches live (the GPU tests switch it)
int W() { return g_pg->size(); }
int R() { return g_pg->rank(); }

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
  auto pa = a.parameters(), pb = b.parameters();
  EXPECT_EQ(pa.size(), pb.size());
  double worst = 0;
  for (size_t i = 0; i < pa.size() && i < pb.size(); ++i) {
    const double scale = std::max(pb[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

// ||a - b|| / ||b|| over all parameters together: for lossy hooks, where a per-tensor maximum is
// dominated by the few smallest weights.
double global_relative_l2(torch::nn::Module& a, torch::nn::Module& b) {
  double diff = 0, norm = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    diff += (pa[i] - pb[i]).to(at::kDouble).pow(2).sum().item<double>();
    norm += pb[i].to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

double max_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

void copy_state(torch::nn::Module& from, torch::nn::Module& to) {
  at::NoGradGuard no_grad;
  auto a = from.parameters(), b = to.parameters();
  for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  auto ba = from.buffers(), bb = to.buffers();
  for (size_t i = 0; i < ba.size(); ++i) bb[i].copy_(ba[i]);
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
  if (hook == Hook::AllReduce) model->register_comm_hook(ddp::allreduce_hook(g_pg));
  if (hook == Hook::Fp16) model->register_comm_hook(ddp::fp16_compress_hook(g_pg));
  if (hook == Hook::Bf16) model->register_comm_hook(ddp::bf16_compress_hook(g_pg));
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
  DistributedDataParallel model(local, g_pg, v.options);
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
std::vector<Variant> compression_variants() {
  using O = DistributedDataParallelOptions;
  return {{"fp16_hook", O(), Hook::Fp16, 5e-2, true},
          {"bf16_hook", O().gradient_as_bucket_view(true), Hook::Bf16, 5e-2, true}};
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
  if (!g_pg->has_nccl()) GTEST_SKIP() << "no CUDA device visible (or no NCCL in this build)";
  g_device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(g_pg->world().local_rank));
  using O = DistributedDataParallelOptions;
  for (const Variant& v : {Variant{"defaults", O()}, Variant{"bucket_view", O().gradient_as_bucket_view(true)},
                           Variant{"tiny_buckets", O().bucket_cap_mb(0.0005).first_bucket_mb(0.0001)},
                           Variant{"bf16_hook", O(), Hook::Bf16, 5e-2, true}}) {
    for (const char* opt : {"sgd", "adam"}) {
      const double diff = train_against_reference<Mlp>(v, opt, false, [](auto& m, const at::Tensor& x, int, int) {
        return m.forward(x);
      });
      std::printf("gpu oracle mlp/%s/%s on %d ranks: %.3g (tolerance %.0e)\n", opt, v.name.c_str(), W(), diff,
                  v.tolerance);
      EXPECT_LE(diff, v.tolerance) << v.name << " " << opt;
    }
  }
  g_device = c10::Device(c10::kCPU);
}

// ---- no_sync ---------------------------------------------------------------------------------

TEST(DdpNoSync, GradientsDifferInsideAndAgreeAfterTheNextSyncedStep) {
  torch::manual_seed(1);
  Mlp reference;
  torch::manual_seed(1);
  Mlp local;
  DistributedDataParallel model(local, g_pg);
  Batch b1 = global_batch(1), b2 = global_batch(2);
  {
    auto guard = model->no_sync();
    Batch mine = shard(b1, R(), W());
    loss_of(model->forward(mine.x), mine.y).backward();
  }
  at::Tensor g = model->module()->fc1->weight.grad().clone();
  auto all = g_pg->all_gather(g);
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
    auto everywhere = g_pg->all_gather(grad.contiguous());
    for (int r = 1; r < W(); ++r) EXPECT_TRUE(at::equal(everywhere[0], everywhere[r]));
    const double scale = std::max(ref_params[i].grad().abs().max().item<double>(), 1e-12);
    EXPECT_LE((grad - ref_params[i].grad()).abs().max().item<double>() / scale, 1e-5);
  }
}

// ---- gradient_as_bucket_view -----------------------------------------------------------------

TEST(DdpBucketView, GradientsAreViewsOfTheBucketsAndAddNoMemory) {
  for (bool views : {false, true}) {
    torch::manual_seed(1);
    Mlp local;
    DistributedDataParallel model(local, g_pg, DistributedDataParallelOptions().gradient_as_bucket_view(views));
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
    DistributedDataParallel model(local, g_pg);
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
    DistributedDataParallel model(local, g_pg);
    FAIL() << "mismatched models accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "DDP: ranks hold different models: parameter 0 ('module.fc1.weight' here) is "
                           "Float[32, 12] on cpu on rank 0 but Float[33, 12] on cpu on rank 1");
  }
}

TEST(DdpErrors, ADifferentParameterCountIsNamed) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  auto net = std::make_shared<torch::nn::Module>();
  net->register_module("a", torch::nn::Linear(2, 2));
  if (R() == 1) net->register_module("b", torch::nn::Linear(2, 2));
  try {
  ddp::detail::DdpCore core(*net, g_pg, {});
    FAIL() << "different parameter counts accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "DDP: ranks hold different models: rank 0 has 2 parameters that require gradients, rank 1 has 4");
  }
}

TEST(DdpErrors, AParameterOnAnotherDeviceIsNamed) {
  auto net = std::make_shared<torch::nn::Module>();
  net->register_module("fc", torch::nn::Linear(2, 2));
  net->register_parameter("stray", at::zeros({2}, at::TensorOptions().device(at::kMeta)));
  try {
    ddp::detail::DdpCore core(*net, g_pg, {});
    FAIL() << "meta parameter accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "DDP: 'stray' is on meta; DDP needs the module on one cpu or cuda device");
  }
}

TEST(DdpErrors, AnUnusedParameterWithoutFindUnusedIsNamed) {
  torch::manual_seed(1);
  Branchy local;
  DistributedDataParallel model(local, g_pg);
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
  DistributedDataParallel model(local, g_pg);
  Batch mine = shard(global_batch(0), R(), W());
  auto out = model->forward(mine.x);
  try {
    model->forward(mine.x);
    FAIL() << "second forward accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward() was called again before"), std::string::npos);
  }
  {
    at::NoGradGuard no_grad;  // evaluation forwards never interfere
    model->forward(mine.x);
  }
  loss_of(out, mine.y).backward();
}

}  // namespace

// Failure scenarios run without GoogleTest under `tandem run` (tests/ddp/expect_failure.sh):
// the error must reach the launcher as a non-zero exit and a clear line, never a hang.
int scenario(const std::string& name) {
  if (name == "skip-backward-on-rank-1") {
    Mlp local;
    DistributedDataParallel model(local, g_pg);
    Batch mine = shard(global_batch(0), R(), W());
    auto loss = loss_of(model->forward(mine.x), mine.y);
    if (R() != 1) loss.backward();  // rank 0 waits in the all-reduce that rank 1 never joins
    model->forward(mine.x);         // rank 1: error
    return 0;
  }
  if (name == "mismatched-models") {
    Mlp local(R() == 1 ? 40 : 32);
    DistributedDataParallel model(local, g_pg);
    return 0;
  }
  throw Error("unknown scenario " + name);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    comm::ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(120);
    g_pg = comm::ProcessGroup::create(comm::World::from_env(), options);
    at::set_num_threads(1);
    if (argc > 1 && std::strncmp(argv[1], "--scenario=", 11) == 0) return scenario(argv[1] + 11);
  } catch (const Error& e) {
    std::fprintf(stderr, "ddp_test: rank %d: %s\n", g_pg ? g_pg->rank() : -1, e.what());
    return 2;
  }
  int rc = RUN_ALL_TESTS();
  g_pg.reset();
  return rc;
}
