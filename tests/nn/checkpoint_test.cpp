// Activation checkpointing in one process (tandem/nn/checkpoint.h): the oracle is the same model
// run without checkpointing, from the same weights and the same generator state. Outputs, every
// gradient and the generator's state after the step must be equal bit for bit (dropout included);
// each checkpointed segment runs its forward exactly twice per step (forward, recompute).
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include "support/errors.h"
#include "tandem/amp/autocast.h"
#include "tandem/nn/checkpoint.h"
#include "tandem/nn/checkpoint_module.h"
#include "tandem/nn/checkpoint_policy.h"
#include "tandem/nn/hookable.h"
#include <torch/nn/modules/container/modulelist.h>

namespace {

// Linear, dropout, GELU, Linear, residual; counts its forwards.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim)
      : torch::nn::Module("Block"),
        fc1(register_module("fc1", torch::nn::Linear(dim, 2 * dim))),
        drop(register_module("drop", torch::nn::Dropout(0.3))),
        fc2(register_module("fc2", torch::nn::Linear(2 * dim, dim))) {}
  at::Tensor forward(at::Tensor x) {
    ++calls;
    return x + fc2(at::gelu(drop(fc1(x))));
  }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
  int calls = 0;
};
TORCH_MODULE(Block);

constexpr int64_t kDim = 8;

torch::nn::Sequential make_net(int blocks) {
  torch::manual_seed(3);
  torch::nn::Sequential net;
  for (int i = 0; i < blocks; ++i) net->push_back(Block(kDim));
  net->push_back(torch::nn::Linear(kDim, 1));
  return net;
}

at::Tensor batch(bool requires_grad) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor x = at::randn({16, kDim}, gen);
  return requires_grad ? x.requires_grad_(true) : x;
}

struct Step {
  at::Tensor output, input_grad, rng_after;
  std::vector<at::Tensor> grads;
};

// One forward and backward of `forward` from generator seed 5; what a step leaves behind.
template <typename F>
Step step(torch::nn::Module& net, const at::Tensor& x, F forward) {
  torch::manual_seed(5);
  Step s;
  s.output = forward(x);
  s.output.pow(2).sum().backward();
  s.rng_after = at::rand({4});  // the generator goes on as if nothing had been recomputed
  if (x.requires_grad()) s.input_grad = x.grad().clone();
  for (const auto& p : net.parameters()) s.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return s;
}

void expect_identical(const Step& a, const Step& b) {
  EXPECT_TRUE(at::equal(a.output, b.output));
  EXPECT_TRUE(at::equal(a.rng_after, b.rng_after));
  EXPECT_EQ(a.input_grad.defined(), b.input_grad.defined());
  if (a.input_grad.defined()) {
    EXPECT_TRUE(at::equal(a.input_grad, b.input_grad));
  }
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_TRUE(a.grads[i].defined()) << "parameter " << i;
    ASSERT_TRUE(b.grads[i].defined()) << "parameter " << i;
    EXPECT_TRUE(at::equal(a.grads[i], b.grads[i])) << "parameter " << i;
  }
}

// Each block called through tandem::nn::checkpoint(block, x): bit-identical, two forwards per block.
TEST(Checkpoint, FunctionFormIsBitIdenticalWithDropout) {
  for (bool input_requires_grad : {true, false}) {
    SCOPED_TRACE(input_requires_grad ? "input requires grad" : "only the parameters require grad");
    auto plain_net = make_net(3);
    const Step plain = step(*plain_net, batch(input_requires_grad), [&](const at::Tensor& x) { return plain_net->forward(x); });
    auto net = make_net(3);
    std::vector<Block> blocks;
    for (size_t i = 0; i < 3; ++i) blocks.emplace_back(std::dynamic_pointer_cast<BlockImpl>(net->ptr(i)));
    auto head = net->ptr<torch::nn::LinearImpl>(3);
    const Step checkpointed = step(*net, batch(input_requires_grad), [&](at::Tensor x) {
      for (auto& b : blocks) x = tandem::nn::checkpoint(b, x);
      return head->forward(x);
    });
    expect_identical(plain, checkpointed);
    for (auto& b : blocks) EXPECT_EQ(b->calls, 2) << "one forward and exactly one recompute";
  }
}

// A lambda with several tensor arguments, a tuple out, and parameters named in the options.
TEST(Checkpoint, LambdaWithParametersAndTupleOutput) {
  torch::manual_seed(1);
  torch::nn::Linear a(4, 4), b(4, 4);
  std::vector<at::Tensor> params = a->parameters();
  for (const auto& p : b->parameters()) params.push_back(p);
  at::Tensor x = at::randn({3, 4}), y = at::randn({3, 4}).requires_grad_(true);
  int calls = 0;
  auto fn = [&](const at::Tensor& u, const at::Tensor& v, double scale) {
    ++calls;
    return std::make_tuple(a(u) * v * scale, b(v).argmax(1));  // the second output has no gradient
  };
  auto [plain, plain_index] = fn(x, y, 0.5);
  plain.sum().backward();
  std::vector<at::Tensor> expected;
  for (const auto& p : params) {
    expected.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    p.mutable_grad() = at::Tensor();
  }
  EXPECT_FALSE(expected[2].defined()) << "b only feeds the argmax";
  const at::Tensor expected_y = y.grad().clone();
  y.mutable_grad() = at::Tensor();

  auto [out, index] = tandem::nn::checkpoint(tandem::nn::CheckpointOptions().parameters(params), fn, x, y, 0.5);
  EXPECT_TRUE(at::equal(out, plain));
  EXPECT_TRUE(at::equal(index, plain_index));
  EXPECT_FALSE(index.requires_grad());
  out.sum().backward();
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(at::equal(y.grad(), expected_y));
  for (size_t i = 0; i < params.size(); ++i) {
    if (i < 2) {
      EXPECT_TRUE(at::equal(params[i].grad(), expected[i])) << i;
    } else {
      EXPECT_FALSE(params[i].grad().defined()) << "b only feeds the argmax: " << i;
    }
  }
}

// Tied weights: a module that registers one tensor under two names lists it twice in parameters();
// its gradient must still arrive once (the sum of both uses), as without checkpointing.
struct TiedImpl : torch::nn::Module {
  TiedImpl() : torch::nn::Module("Tied"), embed(register_module("embed", torch::nn::Linear(kDim, kDim))) {
    register_parameter("head_weight", embed->weight);
  }
  at::Tensor forward(at::Tensor x) { return at::linear(at::tanh(embed(x)), embed->weight.t()); }
  torch::nn::Linear embed;
};
TORCH_MODULE(Tied);

TEST(Checkpoint, TiedWeightsGetTheirGradientOnce) {
  Tied plain, tied;
  torch::NoGradGuard no_grad;
  tied->embed->weight.copy_(plain->embed->weight);
  tied->embed->bias.copy_(plain->embed->bias);
  {
    at::AutoGradMode on(true);
    ASSERT_EQ(tied->parameters().size(), 3u) << "LibTorch lists the tied weight twice";
    const Step expected = step(*plain, batch(true), [&](const at::Tensor& x) { return plain->forward(x); });
    const Step got = step(*tied, batch(true), [&](const at::Tensor& x) { return tandem::nn::checkpoint(tied, x); });
    expect_identical(expected, got);
  }
}

// torch::autograd::grad with respect to the parameters (PyTorch's reentrant checkpoint cannot).
TEST(Checkpoint, AutogradGradReachesParameters) {
  auto plain_net = make_net(1);
  plain_net->eval();  // no dropout: two separate runs
  at::Tensor x = batch(false);
  auto plain = torch::autograd::grad({plain_net->forward(x).sum()}, plain_net->parameters());
  auto net = make_net(1);
  net->eval();
  Block block(std::dynamic_pointer_cast<BlockImpl>(net->ptr(0)));
  at::Tensor y = net->ptr<torch::nn::LinearImpl>(1)->forward(tandem::nn::checkpoint(block, x));
  auto grads = torch::autograd::grad({y.sum()}, net->parameters());
  ASSERT_EQ(grads.size(), plain.size());
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(at::equal(grads[i], plain[i])) << i;
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined()) << "grad() accumulates nothing";
}

// A tensor hook on a parameter runs once per backward, as under torch.utils.checkpoint (its
// non-reentrant form never runs a leaf's hooks for the recompute): a hook that doubles the
// gradient doubles it once, and sees what it would see without checkpointing.
TEST(Checkpoint, ParameterHooksRunOncePerBackward) {
  struct Seen {
    std::vector<int> calls;
    std::vector<at::Tensor> grads;
  };
  auto run = [](bool checkpointed) {
    auto net = make_net(2);
    net->eval();  // no dropout: the two runs draw alike
    auto seen = std::make_shared<Seen>();
    auto params = net->parameters();
    seen->calls.assign(params.size(), 0);
    seen->grads.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].register_hook([seen, i](const at::Tensor& grad) {
        ++seen->calls[i];
        seen->grads[i] = grad.clone();
        return grad * 2;
      });
    }
    const Step s = step(*net, batch(true), [&](const at::Tensor& x) {
      at::Tensor h = x;
      for (size_t b = 0; b + 1 < net->size(); ++b) {
        Block block(std::dynamic_pointer_cast<BlockImpl>(net->ptr(b)));
        h = checkpointed ? tandem::nn::checkpoint(block, h) : block->forward(h);
      }
      return net->ptr<torch::nn::LinearImpl>(net->size() - 1)->forward(h);
    });
    return std::make_pair(s, *seen);
  };
  const auto [plain, plain_seen] = run(false);
  const auto [got, got_seen] = run(true);
  expect_identical(plain, got);
  for (size_t i = 0; i < got_seen.calls.size(); ++i) {
    EXPECT_EQ(plain_seen.calls[i], 1) << "parameter " << i;
    EXPECT_EQ(got_seen.calls[i], 1) << "parameter " << i;
    EXPECT_TRUE(at::equal(got_seen.grads[i], plain_seen.grads[i])) << "parameter " << i;
  }
}

// Without grad mode, or with nothing requiring grad, it is a plain call: one forward.
TEST(Checkpoint, PlainCallWithoutGrad) {
  auto net = make_net(1);
  Block block(std::dynamic_pointer_cast<BlockImpl>(net->ptr(0)));
  {
    at::NoGradGuard no_grad;
    EXPECT_FALSE(tandem::nn::checkpoint(block, batch(true)).requires_grad());
  }
  for (auto& p : block->parameters()) p.requires_grad_(false);
  EXPECT_FALSE(tandem::nn::checkpoint(block, batch(false)).requires_grad());
  EXPECT_EQ(block->calls, 2);
}

// Without the generator's state restored, the recompute draws other dropout masks: the gradients
// differ from the plain run's (so the bit-identical test above does test the restore).
TEST(Checkpoint, WithoutRngRestoreDropoutDiffers) {
  auto plain_net = make_net(2);
  const Step plain = step(*plain_net, batch(true), [&](const at::Tensor& x) { return plain_net->forward(x); });
  auto net = make_net(2);
  tandem::nn::checkpoint_modules(*net, tandem::nn::CheckpointPolicy().preserve_rng_state(false));
  const Step checkpointed = step(*net, batch(true), [&](const at::Tensor& x) { return net->forward(x); });
  EXPECT_TRUE(at::equal(plain.output, checkpointed.output)) << "the forward is the same";
  EXPECT_FALSE(at::equal(plain.grads[0], checkpointed.grads[0])) << "the recompute drew other masks";
}

// On a GPU: dropout draws from the CUDA generator, which the checkpoint saves at forward and
// restores for the recompute (scripts/gpu-check runs it as gpu.nn.checkpoint).
TEST(CheckpointCuda, DropoutOnTheGpuIsBitIdentical) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device visible";
  const c10::Device cuda(c10::kCUDA, 0);
  auto cuda_step = [&](torch::nn::Sequential& net) {
    net->to(cuda);
    Step s = step(*net, batch(true).detach().to(cuda).requires_grad_(true), [&](const at::Tensor& x) { return net->forward(x); });
    s.rng_after = at::rand({4}, at::TensorOptions().device(cuda));  // the CUDA generator goes on as without
    return s;
  };
  auto plain_net = make_net(3);
  const Step plain = cuda_step(plain_net);
  auto net = make_net(3);
  tandem::nn::checkpoint_modules(*net, tandem::nn::CheckpointPolicy());
  const Step checkpointed = cuda_step(net);
  expect_identical(plain, checkpointed);
}

// The module wrapper, every second block (torchtitan's "every N layers": the 2nd, 4th, ...).
TEST(Checkpoint, EveryNthBlockOfASequential) {
  auto plain_net = make_net(4);
  const Step plain = step(*plain_net, batch(true), [&](const at::Tensor& x) { return plain_net->forward(x); });
  auto net = make_net(4);
  std::vector<Block> blocks;
  for (size_t i = 0; i < 4; ++i) blocks.emplace_back(std::dynamic_pointer_cast<BlockImpl>(net->ptr(i)));
  EXPECT_EQ(tandem::nn::checkpoint_modules(*net, tandem::nn::CheckpointPolicy().every_n(2).module_types({"Block"})), 2u);
  std::vector<bool> wrapped;
  for (size_t i = 0; i < 5; ++i) wrapped.push_back(net->ptr(i)->name() == "tandem::nn::Checkpoint");
  EXPECT_EQ(wrapped, (std::vector<bool>{false, true, false, true, false}));
  // The parameter names are the plain model's.
  EXPECT_EQ(net->named_parameters().keys(), plain_net->named_parameters().keys());
  const Step checkpointed = step(*net, batch(true), [&](const at::Tensor& x) { return net->forward(x); });
  expect_identical(plain, checkpointed);
  std::vector<int> calls;
  for (auto& b : blocks) calls.push_back(b->calls);
  EXPECT_EQ(calls, (std::vector<int>{1, 2, 1, 2}));
  // Applied again: the wrapped blocks count as checkpointed, nothing is wrapped twice.
  EXPECT_EQ(tandem::nn::checkpoint_modules(*net, tandem::nn::CheckpointPolicy().every_n(2).module_types({"Block"})), 2u);
}

// Blocks held outside a Sequential: in a ModuleList and as a named member, each a
// tandem::nn::Hookable, picked by name; a plain member a name picks is a one-line error.
struct StackImpl : torch::nn::Module {
  StackImpl() : torch::nn::Module("Stack") {
    torch::manual_seed(3);
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 4; ++i) blocks->push_back(tandem::nn::Hookable(Block(kDim)));
    head = register_module("head", tandem::nn::Hookable(Block(kDim)));
    tail = register_module("tail", Block(kDim));
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& b : *blocks) x = b->as<tandem::nn::HookableImpl>()->forward(x);
    return tail(head(x));
  }
  int calls_of(size_t i) { return blocks[i]->as<tandem::nn::HookableImpl>()->module()->as<BlockImpl>()->calls; }
  torch::nn::ModuleList blocks{nullptr};
  tandem::nn::Hookable head{nullptr};
  Block tail{nullptr};
};
TORCH_MODULE(Stack);

TEST(Checkpoint, BlocksPickedByNameWhereverTheyAreHeld) {
  Stack plain_net;
  const Step plain = step(*plain_net, batch(true), [&](const at::Tensor& x) { return plain_net->forward(x); });
  Stack net;
  EXPECT_EQ(tandem::nn::checkpoint_modules(*net, tandem::nn::CheckpointPolicy().every_n(2).module_names({"blocks.*", "head"})),
            2u);  // blocks.1 and blocks.3 of the 5 candidates
  EXPECT_EQ(net->named_parameters().keys(), plain_net->named_parameters().keys());
  const Step checkpointed = step(*net, batch(true), [&](const at::Tensor& x) { return net->forward(x); });
  expect_identical(plain, checkpointed);
  std::vector<int> calls;
  for (size_t i = 0; i < 4; ++i) calls.push_back(net->calls_of(i));
  EXPECT_EQ(calls, (std::vector<int>{1, 2, 1, 2}));  // the picked ones ran again in backward
  EXPECT_FALSE(net->head->activation_checkpointing());
  Stack by_type;
  EXPECT_EQ(tandem::nn::checkpoint_modules(
                *by_type, tandem::nn::CheckpointPolicy().module_names({"blocks.*", "head"}).module_types({"Block"})),
            5u);  // every_n 1: all of them
}

TEST(CheckpointErrors, ANamedPlainMemberIsAOneLineError) {
  Stack net;
  EXPECT_ERROR(tandem::nn::checkpoint_modules(*net, tandem::nn::CheckpointPolicy().module_names({"tail"})),
               "activation checkpointing: 'tail' (Block) matches the policy's module_names but is held by 'Stack' "
               "as a plain member: LibTorch calls its forward with no way to run code around it; hold it in a "
               "torch::nn::Sequential, or as a tandem::nn::Hookable");
  EXPECT_ERROR(tandem::nn::checkpoint_modules(*net, tandem::nn::CheckpointPolicy().module_names({"nothing.*"})),
               "activation checkpointing: 'Stack' has no block to checkpoint (a module with parameters named by "
               "the policy's module_names): put the blocks in a Sequential, or wrap them in tandem::nn::Checkpoint "
               "yourself");
}

// The forward's autocast state is the recompute's (backward runs outside the autocast scope).
TEST(Checkpoint, RecomputeUnderTheForwardsAutocast) {
  auto run = [](bool checkpointed) {
    auto net = make_net(2);
    net->eval();
    if (checkpointed) tandem::nn::checkpoint_modules(*net);
    at::Tensor y;
    {
      tandem::amp::AutocastScope autocast(c10::kCPU, at::kBFloat16);
      y = net->forward(batch(true));
    }
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    y.to(at::kFloat).sum().backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = run(false), checkpointed = run(true);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], checkpointed[i])) << i;
}

TEST(CheckpointErrors, DoubleBackward) {
  auto net = make_net(1);
  Block block(std::dynamic_pointer_cast<BlockImpl>(net->ptr(0)));
  at::Tensor x = batch(true);
  at::Tensor y = tandem::nn::checkpoint(block, x).sum();
  EXPECT_ERROR(torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true),
               "checkpoint: backward with create_graph=true (a double backward) through a checkpointed segment is not "
               "supported: take higher-order gradients without checkpointing");
}

TEST(CheckpointErrors, RecomputeOfAnotherShape) {
  int calls = 0;
  torch::nn::Linear fc(4, 4);
  auto fn = [&](const at::Tensor& x) { return fc(x).narrow(0, 0, ++calls == 1 ? 2 : 1); };
  at::Tensor y = tandem::nn::checkpoint(tandem::nn::CheckpointOptions().parameters(fc->parameters()), fn, at::ones({3, 4}));
  EXPECT_ERROR(y.sum().backward(),
               "checkpoint: the recompute in backward returned tensors of shapes [[1, 4]] where the forward returned "
               "[[2, 4]]: a checkpointed function must compute the same again (no state that changes between its calls)");
}

// A parameter the segment reads but the options do not name: its gradient would be lost.
TEST(CheckpointErrors, UnnamedParameter) {
  torch::nn::Linear named(4, 4), unnamed(4, 4);
  auto fn = [&](const at::Tensor& x) { return unnamed(named(x)); };
  at::Tensor y = tandem::nn::checkpoint(tandem::nn::CheckpointOptions().parameters(named->parameters()), fn,
                                        at::ones({3, 4}));
  EXPECT_ERROR(y.sum().backward(),
               "checkpoint: the checkpointed function read 2 tensor(s) requiring grad that are neither its arguments "
               "nor in CheckpointOptions::parameters (the first of shape [4, 4]): their gradients would be lost; pass "
               "them as arguments or list them in the options");
  EXPECT_FALSE(named->weight.grad().defined()) << "nothing half-delivered";
}

TEST(CheckpointErrors, UndefinedOutput) {
  at::Tensor x = at::ones({2}).requires_grad_(true);
  EXPECT_ERROR(tandem::nn::checkpoint([](const at::Tensor& a) { return std::vector<at::Tensor>{a * 2, at::Tensor()}; }, x),
               "checkpoint: output 1 of the checkpointed function is an undefined tensor: return defined tensors only");
}

TEST(CheckpointErrors, UndefinedParameter) {
  at::Tensor x = at::ones({2}).requires_grad_(true);
  EXPECT_ERROR(tandem::nn::checkpoint(tandem::nn::CheckpointOptions().parameters({at::Tensor()}),
                                      [](const at::Tensor& a) { return a * 2; }, x),
               "checkpoint: parameter 0 of CheckpointOptions::parameters is an undefined tensor");
}

TEST(CheckpointErrors, Policies) {
  auto net = make_net(2);
  EXPECT_ERROR(tandem::nn::checkpoint_modules(*net, tandem::nn::CheckpointPolicy().every_n(0)),
               "activation checkpointing: every_n must be 1 or more, got 0");
  EXPECT_ERROR(tandem::nn::checkpoint_modules(*net, tandem::nn::CheckpointPolicy().module_types({"Attention"})),
               "activation checkpointing: 'torch::nn::SequentialImpl' has no block to checkpoint (an entry with parameters "
               "of a torch::nn::Sequential of the policy's module_types): put the blocks in a Sequential, or wrap them "
               "in tandem::nn::Checkpoint yourself");
  tandem::nn::Checkpoint once(Block(2));
 EXPECT_ERROR(std::make_shared<tandem::nn::CheckpointImpl>(once), "nn::Checkpoint: 'tandem::nn::Checkpoint' is checkpointed already: wrap a module once");
}

}  // namespace
