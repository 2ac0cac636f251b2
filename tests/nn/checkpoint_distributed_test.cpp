// Activation checkpointing under DDP, FSDP and the Accelerator, against the same job without it:
// losses, gradients and parameters after three SGD steps equal bit for bit (dropout on, each rank
// its own batch and its own dropout seed). Under DDP every parameter's AccumulateGrad hook fires
// exactly as often as in the plain run (once per used parameter and backward), also with
// find_unused_parameters and static_graph. Under FSDP a checkpointed unit is gathered again before
// its recompute (the gathers counted) and the job gathers as often as plain FSDP. Runs as a world of
// one and as 2 Gloo ranks (with 2 ranks, sums of two terms are the same in any order: bitwise holds).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "support/distributed_main.h"
#include "support/errors.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/fsdp/auto_wrap.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/nn/checkpoint_module.h"
#include "tandem/nn/checkpoint_policy.h"

namespace test = tandem::test;
namespace fsdp = tandem::fsdp;

namespace {

constexpr int64_t kDim = 12;
constexpr int kSteps = 3;

// What a block's forward saw, per call: grad mode (a recompute runs with it on inside backward),
// and how many times FSDP had gathered its unit by then (set by the test; -1 when not under FSDP).
struct Call {
  bool grad_mode;
  int64_t gathers;
};

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim)
      : torch::nn::Module("Block"),
        fc1(register_module("fc1", torch::nn::Linear(dim, 2 * dim))),
        drop(register_module("drop", torch::nn::Dropout(0.25))),
        fc2(register_module("fc2", torch::nn::Linear(2 * dim, dim))) {}
  at::Tensor forward(at::Tensor x) {
    calls.push_back({at::GradMode::is_enabled(), gathers ? gathers() : -1});
    return x + fc2(at::gelu(drop(fc1(x))));
  }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
  std::vector<Call> calls;
  std::function<int64_t()> gathers;
};
TORCH_MODULE(Block);

// Three blocks in a Sequential, a head, and (`with_unused`) a layer no forward uses.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool with_unused = false) : torch::nn::Module("Net") {
    torch::manual_seed(7);
    for (int i = 0; i < 3; ++i) blocks->push_back(Block(kDim));
    register_module("blocks", blocks);
    head = register_module("head", torch::nn::Linear(kDim, 1));
    if (with_unused) spare = register_module("spare", torch::nn::Linear(kDim, 1));
  }
  at::Tensor forward(at::Tensor x) { return head(blocks->forward(x)); }
  BlockImpl& block(size_t i) {
    auto* m = blocks->ptr(i).get();
    if (auto* c = dynamic_cast<tandem::nn::CheckpointImpl*>(m)) m = c->module().get();
    if (auto* u = dynamic_cast<fsdp::UnitImpl*>(m)) m = u->module().get();
    return dynamic_cast<BlockImpl&>(*m);
  }
  torch::nn::Sequential blocks;
  torch::nn::Linear head{nullptr}, spare{nullptr};
};
TORCH_MODULE(Net);

at::Tensor batch(int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 10 * test::pg().rank() + step);
  return at::randn({8, kDim}, gen);
}
void seed_dropout(int step) { torch::manual_seed(100 + 10 * test::pg().rank() + step); }

// Counts each parameter's AccumulateGrad post-hook, as DDP's and FSDP's own hooks sit.
class Counter : public torch::autograd::FunctionPostHook {
 public:
  explicit Counter(int* count) : count_(count) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ++*count_;
    return outputs;
  }

 private:
  int* count_;
};

struct Job {
  std::vector<at::Tensor> losses, grads, params;
  std::vector<std::vector<int>> hook_counts;  // per step, per parameter
};

void expect_identical(const Job& plain, const Job& checkpointed) {
  ASSERT_EQ(plain.losses.size(), checkpointed.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_TRUE(at::equal(plain.losses[i], checkpointed.losses[i])) << "loss " << i;
  ASSERT_EQ(plain.grads.size(), checkpointed.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_EQ(plain.grads[i].defined(), checkpointed.grads[i].defined()) << "gradient " << i;
    if (plain.grads[i].defined() && checkpointed.grads[i].defined()) {
      EXPECT_TRUE(at::equal(plain.grads[i], checkpointed.grads[i])) << "gradient " << i;
    }
  }
  ASSERT_EQ(plain.params.size(), checkpointed.params.size());
  for (size_t i = 0; i < plain.params.size(); ++i) EXPECT_TRUE(at::equal(plain.params[i], checkpointed.params[i])) << "parameter " << i;
}

// ---- DDP ------------------------------------------------------------------------------------

Job ddp_run(bool checkpointed, tandem::ddp::DistributedDataParallelOptions options, Net& net) {
  if (checkpointed) tandem::nn::checkpoint_modules(*net);
  std::vector<at::Tensor> params = net->parameters();
  std::vector<int> counts(params.size(), 0);
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    hooks.emplace_back(acc, acc->add_post_hook(std::make_unique<Counter>(&counts[i])));
  }
  tandem::ddp::DistributedDataParallel model(net, test::shared_pg(), options);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  Job run;
  for (int step = 0; step < kSteps; ++step) {
    std::fill(counts.begin(), counts.end(), 0);
    opt.zero_grad();
    seed_dropout(step);
    at::Tensor loss = model->forward(batch(step)).pow(2).mean();
    loss.backward();
    run.losses.push_back(loss.detach());
    run.hook_counts.push_back(counts);
    if (step == kSteps - 1) {
      for (const auto& p : params) run.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    }
    opt.step();
  }
  for (const auto& p : params) run.params.push_back(p.detach().clone());
  for (auto& [acc, key] : hooks) acc->del_post_hook(key);
  return run;
}

struct DdpCase {
  std::string name;
  tandem::ddp::DistributedDataParallelOptions options;
  bool with_unused;  // a layer no forward uses: DDP must be told (find_unused_parameters or static_graph)
};
void PrintTo(const DdpCase& c, std::ostream* out) { *out << c.name; }
class CheckpointDdp : public ::testing::TestWithParam<DdpCase> {};

TEST_P(CheckpointDdp, EqualsPlainDdpAndEveryHookFiresOnce) {
  auto options = GetParam().options;
  const bool with_unused = GetParam().with_unused;
  Net plain_net(with_unused), net(with_unused);
  const Job plain = ddp_run(false, options, plain_net);
  const Job checkpointed = ddp_run(true, options, net);
  expect_identical(plain, checkpointed);
  EXPECT_EQ(plain.hook_counts, checkpointed.hook_counts);
  // spare.weight and spare.bias come last, and get no gradient
  const size_t spare = net->parameters().size() - (with_unused ? 2 : 0);
  for (const auto& counts : checkpointed.hook_counts) {
    for (size_t i = 0; i < counts.size(); ++i) EXPECT_EQ(counts[i], i >= spare ? 0 : 1) << "parameter " << i;
  }
  for (size_t b = 0; b < 3; ++b) EXPECT_EQ(net->block(b).calls.size(), 2u * kSteps) << "one recompute per block and step";
}

INSTANTIATE_TEST_SUITE_P(
    Options, CheckpointDdp,
    ::testing::Values(
        DdpCase{"default", tandem::ddp::DistributedDataParallelOptions(), false},
        DdpCase{"find_unused_parameters", tandem::ddp::DistributedDataParallelOptions().find_unused_parameters(true), true},
        DdpCase{"static_graph", tandem::ddp::DistributedDataParallelOptions().static_graph(true), true}),
    [](const auto& info) { return info.param.name; });

// ---- FSDP -----------------------------------------------------------------------------------

struct FsdpRun {
  Job run;
  std::vector<int64_t> gathers;  // per unit, after the job
};

FsdpRun fsdp_run(bool checkpointed, bool reshard_after_forward, Net& net) {
  fsdp::wrap_entries(*net->blocks);
  auto options = fsdp::FullyShardOptions().reshard_after_forward(reshard_after_forward);
  if (checkpointed) options.activation_checkpointing(tandem::nn::CheckpointPolicy());
  fsdp::FullyShardedDataParallel model(net, test::shared_pg(), options);
  for (size_t b = 0; b < 3; ++b) {
    net->block(b).gathers = [&model, b] { return model->units().at(b).gathers; };  // units in tree order
  }
  torch::optim::SGD opt(model->shard_parameters(), torch::optim::SGDOptions(0.1));
  FsdpRun out;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    seed_dropout(step);
    at::Tensor loss = model->forward(batch(step)).pow(2).mean();
    loss.backward();
    out.run.losses.push_back(loss.detach());
    if (step == kSteps - 1) {
      for (const auto& p : model->shard_parameters()) out.run.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    }
    opt.step();
  }
  for (const auto& [name, p] : model->gather_parameters()) out.run.params.push_back(p);
  for (const auto& unit : model->units()) out.gathers.push_back(unit.gathers);
  for (size_t b = 0; b < 3; ++b) net->block(b).gathers = nullptr;
  return out;
}

class CheckpointFsdp : public ::testing::TestWithParam<bool> {};

TEST_P(CheckpointFsdp, UnitGatheredAgainForTheRecomputeAndEqualsPlainFsdp) {
  const bool reshard = GetParam();
  Net plain_net, net;
  const FsdpRun plain = fsdp_run(false, reshard, plain_net);
  const FsdpRun checkpointed = fsdp_run(true, reshard, net);
  expect_identical(plain.run, checkpointed.run);
  EXPECT_EQ(plain.gathers, checkpointed.gathers) << "no more gathers than plain FSDP";
  for (size_t b = 0; b < 3; ++b) {
    const auto& calls = net->block(b).calls;
    ASSERT_EQ(calls.size(), 2u * kSteps) << "block " << b << ": one forward and one recompute per step";
    for (int step = 0; step < kSteps; ++step) {
      const Call& forward = calls[2 * step];
      const Call& recompute = calls[2 * step + 1];
      EXPECT_FALSE(forward.grad_mode) << "the forward keeps no activation";
      EXPECT_TRUE(recompute.grad_mode);
      // Freed after its forward and gathered again for its backward, where the recompute runs; the
      // last unit of the forward is the first of backward and stays gathered, once the engine knows
      // the order from a step before (Note [FSDP schedule]).
      const bool kept = b == 2 && step > 0;
      EXPECT_EQ(recompute.gathers - forward.gathers, reshard && !kept ? 1 : 0) << "block " << b << ", step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ReshardAfterForward, CheckpointFsdp, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "on" : "off"; });

// A module whose forward runs a unit.
struct HoldsUnitImpl : torch::nn::Module {
  HoldsUnitImpl() : inner(register_module("inner", fsdp::Unit(Block(kDim)))) {}
  at::Tensor forward(at::Tensor x) { return inner(x); }
  fsdp::Unit inner;
};
TORCH_MODULE(HoldsUnit);

TEST(CheckpointFsdpErrors, UnitInsideACheckpoint) {
  auto outer = torch::nn::Sequential(tandem::nn::Checkpoint(HoldsUnit()));
  EXPECT_ERROR(fsdp::FullyShardedDataParallel(outer, test::shared_pg()),
               "fsdp: unit '0.inner' is inside '0', which is checkpointed: checkpoint the inner units instead (a unit "
               "cannot run inside another's recompute)");
  auto unit_of_units = torch::nn::Sequential(fsdp::Unit(HoldsUnit()));
  unit_of_units->ptr<fsdp::UnitImpl>(0)->set_activation_checkpointing(true);
  EXPECT_ERROR(fsdp::FullyShardedDataParallel(unit_of_units, test::shared_pg()),
               "fsdp: unit '0.inner' is inside '0', which is checkpointed: checkpoint the inner units instead (a unit "
               "cannot run inside another's recompute)");
  fsdp::Unit unit{Block(kDim)};
  EXPECT_ERROR(std::make_shared<tandem::nn::CheckpointImpl>(unit),
               "nn::Checkpoint: 'tandem::fsdp::Unit' checkpoints itself (a tandem::fsdp::Unit): call "
               "set_activation_checkpointing(true) on it instead of wrapping it, so that its gathers stay outside the "
               "recompute");
}

// A unit called from a checkpointed lambda: the module tree does not show it, the recompute does.
struct LambdaRunsUnitImpl : torch::nn::Module {
  LambdaRunsUnitImpl() : inner(register_module("inner", fsdp::Unit(Block(kDim)))) {}
  at::Tensor forward(at::Tensor x) {
    return tandem::nn::checkpoint(tandem::nn::CheckpointOptions().parameters(inner->parameters()),
                                  [this](const at::Tensor& y) { return inner(y); }, x);
  }
  fsdp::Unit inner;
};
TORCH_MODULE(LambdaRunsUnit);

TEST(CheckpointFsdpErrors, UnitRunInsideARecompute) {
  auto net = torch::nn::Sequential(LambdaRunsUnit());
  fsdp::FullyShardedDataParallel model(net, test::shared_pg());
  at::Tensor loss = model->forward(batch(0).requires_grad_(true)).sum();
  EXPECT_ERROR(loss.backward(), "fsdp: unit '0.inner' ran inside an activation checkpoint's recompute: checkpoint the "
               "inner units instead (a unit cannot run inside a recompute)");
}

// ---- The Accelerator ------------------------------------------------------------------------

Job accelerator_run(tandem::Strategy strategy, bool checkpointed) {
  auto options = tandem::AcceleratorOptions().strategy(strategy).seed(5).progress(false);
  if (checkpointed) options.activation_checkpointing(tandem::nn::CheckpointPolicy().every_n(2));
  tandem::Accelerator acc(test::shared_pg(), options);
  Net net;
  auto model = acc.prepare_model(net);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  acc.prepare_optimizer(opt);
  Job run;
  for (int step = 0; step < kSteps; ++step) {
    seed_dropout(step);
    at::Tensor loss = model->forward(batch(step)).pow(2).mean();
    acc.backward(loss);
    acc.step(opt);
    acc.zero_grad(opt);
    run.losses.push_back(loss.detach());
  }
  std::vector<size_t> calls;
  for (size_t b = 0; b < 3; ++b) calls.push_back(net->block(b).calls.size());
  EXPECT_EQ(calls, (std::vector<size_t>{kSteps, checkpointed ? 2u * kSteps : kSteps, kSteps})) << "every 2nd block";
  for (const auto& p : acc.unwrap(model)->parameters()) run.params.push_back(p.detach().clone());
  return run;
}

TEST(CheckpointAccelerator, DdpAndFsdpTrainAsWithout) {
  for (auto strategy : {tandem::Strategy::Ddp, tandem::Strategy::Fsdp}) {
    SCOPED_TRACE(tandem::to_string(strategy));
    expect_identical(accelerator_run(strategy, false), accelerator_run(strategy, true));
  }
}

TEST(CheckpointAccelerator, RefusedUnderDataParallel) {
  if (test::pg().size() > 1) GTEST_SKIP() << "DataParallel runs in one process";
  tandem::Accelerator acc(test::shared_pg(), tandem::AcceleratorOptions()
                                                 .strategy(tandem::Strategy::DataParallel)
                                                 .dp(tandem::dp::DataParallelOptions().devices({c10::kCPU, c10::kCPU}))
                                                 .activation_checkpointing(tandem::nn::CheckpointPolicy())
                                                 .progress(false));
  EXPECT_ERROR(acc.prepare_model(Net()),
               "Accelerator: activation_checkpointing is not available under DataParallel (its replicas are clones of "
               "the model): start one process per device (tandem run --nproc-per-node N) with Strategy::Ddp or Fsdp");
}

}  // namespace

int main(int argc, char** argv) { return test::distributed_test_main(argc, argv, {}); }
