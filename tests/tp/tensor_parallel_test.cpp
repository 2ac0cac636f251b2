// Tensor parallelism against a single process: one binary, run as a world of one and as every
// rank of a `tandem run` job (2 and 4 Gloo ranks). Each rank also builds the whole model from the
// same seed and runs it on the whole batch: the oracle. Outputs and losses agree to fp32
// reduction-order tolerance, each rank's gradient pieces joined over the group are the whole
// gradients, replicated parameters' gradients are bit-identical across the group, and after AdamW
// steps the joined weights are the single process's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <torch/nn/utils/clip_grad.h>

#include "accelerate/sharded_tensors.h"
#include "support/compare.h"
#include "support/distributed_main.h"
#include "tandem/accelerate/accelerator.h"
#include "support/errors.h"
#include "tandem/comm/device_mesh.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/nn/checkpoint_module.h"
#include "tandem/nn/hookable.h"
#include "tandem/nn/region_rng.h"
#include "tandem/tp/functional.h"
#include "tandem/tp/loss_parallel.h"
#include "tandem/tp/parallelize.h"
#include "tandem/tp/random.h"

namespace {

using tandem::comm::Placement;
using tandem::nn::Hookable;
using tandem::test::close_at_scale;
using tandem::test::pg;
using tandem::test::shared_pg;
namespace tp = tandem::tp;

int W() { return pg().size(); }
int R() { return pg().rank(); }

// ---------------------------------------------------------------------------------------------
// The differentiable collectives, against closed forms: rank r holds x_r = (r + 1) * base and
// weighs its output by w_r = r + 2 before summing it into its loss, so the gradient each
// function's backward must produce is known.

at::Tensor base() { return at::arange(24, at::kFloat).view({2, 4, 3}) * 0.5; }
double weight_of(int r) { return r + 2.0; }
double sum_of_weights() {
  double s = 0;
  for (int r = 0; r < W(); ++r) s += weight_of(r);
  return s;
}

TEST(TpFunctional, CopyToIsTheIdentityWithAnAllReducedGradient) {
  at::Tensor x = (base() * (R() + 1)).requires_grad_();
  at::Tensor y = tp::copy_to(x, shared_pg());
  EXPECT_TRUE(at::equal(y, x));
  (y * weight_of(R())).sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), at::full_like(x, sum_of_weights())));
}

TEST(TpFunctional, ReduceFromSumsAndPassesTheGradientThrough) {
  at::Tensor x = (base() * (R() + 1)).requires_grad_();
  at::Tensor y = tp::reduce_from(x, shared_pg());
  EXPECT_TRUE(at::allclose(y, base() * (W() * (W() + 1) / 2.0)));
  (y * weight_of(R())).sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), at::full_like(x, weight_of(R()))));
}

TEST(TpFunctional, GatherAndScatterAlongAnyDimensionAreEachOthersBackward) {
  for (int64_t dim : {0, 1, -1}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    at::Tensor whole = at::arange(2 * 4 * 4, at::kFloat).view({2, 4, 4}).repeat_interleave(W(), d);
    at::Tensor mine = whole.chunk(W(), d)[R()].contiguous().requires_grad_();
    // gather_from: the whole tensor; the gradient comes back the same on every rank: keep my chunk.
    at::Tensor gathered = tp::gather_from(mine, dim, shared_pg());
    EXPECT_TRUE(at::equal(gathered, whole)) << "dim " << dim;
    at::Tensor g = at::arange(whole.numel(), at::kFloat).view(whole.sizes());
    gathered.backward(g);
    EXPECT_TRUE(at::equal(mine.grad(), g.chunk(W(), d)[R()])) << "dim " << dim;
    // all_gather: the same forward; the gradients are partial sums: reduce-scatter them.
    at::Tensor mine2 = mine.detach().clone().requires_grad_();
    tp::all_gather(mine2, dim, shared_pg()).backward(g * weight_of(R()));
    EXPECT_TRUE(at::allclose(mine2.grad(), g.chunk(W(), d)[R()] * sum_of_weights())) << "dim " << dim;
    // scatter_to: my chunk of a replicated tensor; the gradient all-gathered back.
    at::Tensor rep = whole.clone().requires_grad_();
    at::Tensor chunk = tp::scatter_to(rep, dim, shared_pg());
    EXPECT_TRUE(at::equal(chunk, mine.detach())) << "dim " << dim;
    chunk.backward(at::full_like(chunk, R() + 1.0));
    std::vector<at::Tensor> expected;
    for (int r = 0; r < W(); ++r) expected.push_back(at::full_like(chunk, r + 1.0));
    EXPECT_TRUE(at::equal(rep.grad(), at::cat(expected, d))) << "dim " << dim;
    // reduce_scatter: my chunk of the sum; the gradient all-gathered back.
    at::Tensor partial = (whole * (R() + 1)).requires_grad_();
    at::Tensor reduced = tp::reduce_scatter(partial, dim, shared_pg());
    EXPECT_TRUE(at::allclose(reduced, whole.chunk(W(), d)[R()] * (W() * (W() + 1) / 2.0))) << "dim " << dim;
    reduced.backward(at::full_like(reduced, R() + 1.0));
    EXPECT_TRUE(at::equal(partial.grad(), at::cat(expected, d))) << "dim " << dim;
  }
}

TEST(TpFunctional, ADimensionThatDoesNotDivideIsAOneLineError) {
  if (W() == 1) GTEST_SKIP() << "every size divides by 1";
  at::Tensor odd = at::ones({2, W() + 1});
  EXPECT_ERROR(tp::scatter_to(odd, 1, shared_pg()),
               "tp: a chunk along dimension 1 of size " + std::to_string(W() + 1) +
                   ", which does not divide among the " + std::to_string(W()) + " ranks of the tensor-parallel group");
  EXPECT_ERROR_HAS(tp::reduce_scatter(odd, -1, shared_pg()), "tp: a reduce-scatter along dimension -1 of size");
}

// ---------------------------------------------------------------------------------------------
// Loss parallelism against at::cross_entropy_loss on the whole logits.

TEST(TpLossParallel, EqualsTheWholeCrossEntropyWithIgnoredTargets) {
  const int64_t classes = 6 * W();
  torch::manual_seed(3);
  at::Tensor whole = at::randn({5, 7, classes}) * 3;
  at::Tensor target = at::randint(0, classes, {5, 7});
  target.index_put_({0, at::indexing::Slice(0, 3)}, -100);
  target.index_put_({2, 4}, 1);
  for (auto reduction : {at::Reduction::Mean, at::Reduction::Sum, at::Reduction::None}) {
    at::Tensor ref_logits = whole.clone().requires_grad_();
    at::Tensor ref = at::cross_entropy_loss(ref_logits.view({-1, classes}), target.view({-1}), {}, reduction);
    if (reduction == at::Reduction::None) ref = ref.view(target.sizes());
    at::Tensor mine = whole.chunk(W(), -1)[R()].clone().requires_grad_();
    at::Tensor loss = tp::cross_entropy(mine, target, shared_pg(), tp::CrossEntropyOptions().reduction(reduction));
    EXPECT_TRUE(at::allclose(loss, ref, 1e-5, 1e-6)) << loss << " vs " << ref;
    at::Tensor g = at::rand_like(ref) + 0.5;
    ref.backward(g);
    loss.backward(g);
    EXPECT_TRUE(close_at_scale(mine.grad(), ref_logits.grad().chunk(W(), -1)[R()], 1e-5));
  }
}

TEST(TpLossParallel, Bfloat16LogitsAreComputedInFloat) {
  const int64_t classes = 4 * W();
  torch::manual_seed(4);
  at::Tensor whole = (at::randn({6, classes}) * 2).to(at::kBFloat16);
  at::Tensor target = at::randint(0, classes, {6});
  at::Tensor ref = at::cross_entropy_loss(whole.to(at::kFloat), target);
  at::Tensor mine = whole.chunk(W(), -1)[R()].clone().requires_grad_();
  at::Tensor loss = tp::cross_entropy(mine, target, shared_pg());
  EXPECT_EQ(loss.scalar_type(), at::kBFloat16);
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-2 * std::abs(ref.item<double>()));
  loss.backward();
  EXPECT_EQ(mine.grad().scalar_type(), at::kBFloat16);
}

TEST(TpLossParallel, NoValidTargetIsNaNAndABadTargetAnError) {
  at::Tensor mine = at::randn({3, 4});
  at::Tensor none = at::full({3}, -100, at::kLong);
  EXPECT_TRUE(at::isnan(tp::cross_entropy(mine, none, shared_pg())).item<bool>());
  at::Tensor bad = at::tensor({0, 4 * W(), 1}, at::kLong);
  EXPECT_ERROR(tp::cross_entropy(mine, bad, shared_pg()),
               "tp: cross_entropy: a target (" + std::to_string(4 * W()) + ") is outside the " + std::to_string(4 * W()) +
                   " classes of the sharded logits (4 on each of " + std::to_string(W()) + " ranks)");
  EXPECT_ERROR_HAS(tp::cross_entropy(mine, at::zeros({4}, at::kLong), shared_pg()),
                   "tp: cross_entropy: targets of shape [4] for logits of shape [3, 4]");
}

// ---------------------------------------------------------------------------------------------
// A small GPT whose layers are Hookable: the plans' targets.

constexpr int64_t kVocab = 16, kDim = 16, kHeads = 4, kContext = 8;

struct AttentionImpl : torch::nn::Module {
  AttentionImpl()
      : q(register_module("q", Hookable(torch::nn::Linear(kDim, kDim)))),
        // No bias for k: softmax ignores what it adds to every score of a row, so its gradient is
        // zero but for rounding, and AdamW would step on the rounding's sign.
        k(register_module("k", Hookable(torch::nn::Linear(torch::nn::LinearOptions(kDim, kDim).bias(false))))),
        v(register_module("v", Hookable(torch::nn::Linear(kDim, kDim)))),
        proj(register_module("proj", Hookable(torch::nn::Linear(kDim, kDim)))) {}
  at::Tensor forward(at::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), head_dim = kDim / kHeads;
    // Heads from the width the layers give (kHeads / tp of them under tensor parallelism).
    auto split = [&](const at::Tensor& y) { return y.view({b, t, -1, head_dim}).transpose(1, 2); };
    at::Tensor y = at::scaled_dot_product_attention(split(q(x)), split(k(x)), split(v(x)), {}, 0.0, true);
    return proj(y.transpose(1, 2).reshape({b, t, -1}));
  }
  Hookable q, k, v, proj;
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", Hookable(torch::nn::Linear(kDim, 4 * kDim)))),
        fc2(register_module("fc2", Hookable(torch::nn::Linear(4 * kDim, kDim)))) {}
  at::Tensor forward(at::Tensor x) { return fc2(at::gelu(fc1(x))); }
  Hookable fc1, fc2;
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln1(register_module("ln1", Hookable(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim}))))),
        attn(register_module("attn", Hookable(Attention()))),
        ln2(register_module("ln2", Hookable(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim}))))),
        mlp(register_module("mlp", Hookable(Mlp()))) {}
  at::Tensor forward(at::Tensor x) {
    at::Tensor h = x + attn(ln1(x));
    return h + mlp(ln2(h));
  }
  Hookable ln1, attn, ln2, mlp;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  /// `checkpointed`: every block's forward recomputed in backward (tandem::nn::Checkpoint).
  explicit GptImpl(bool checkpointed = false)
      : tok(register_module("tok", Hookable(torch::nn::Embedding(kVocab, kDim)))),
        pos(register_parameter("pos", at::randn({kContext, kDim}) * 0.1)),
        blocks(register_module("blocks", torch::nn::Sequential())),
        ln_f(register_module("ln_f", Hookable(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim}))))),
        head(register_module("head", Hookable(torch::nn::Linear(kDim, kVocab)))) {
    for (int i = 0; i < 2; ++i) {
      if (checkpointed) {
        blocks->push_back(Hookable(tandem::nn::Checkpoint(Block())));
      } else {
        blocks->push_back(Hookable(Block()));
      }
    }
  }
  at::Tensor forward(at::Tensor tokens) {
    at::Tensor h = tok(tokens) + pos.slice(0, 0, tokens.size(1));
    return head(ln_f(blocks->forward(h)));
  }
  Hookable tok;
  at::Tensor pos;
  torch::nn::Sequential blocks;
  Hookable ln_f, head;
};
TORCH_MODULE(Gpt);

Gpt make_gpt(bool checkpointed = false) {
  torch::manual_seed(11);
  return Gpt(checkpointed);
}

std::pair<at::Tensor, at::Tensor> batch(int64_t sequences, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor seq = at::randint(0, kVocab, {sequences, kContext + 1}, gen);
  return {seq.slice(1, 0, kContext).contiguous(), seq.slice(1, 1).contiguous()};
}

// Megatron's plan: attention's and the MLP's first layers column-wise, their second row-wise, the
// embedding's vocabulary cut, the head's classes cut for the parallel loss.
tp::Plan megatron_plan() {
  return {{"tok", tp::RowwiseParallel()},
          {"blocks.*.attn.[qkv]", tp::ColwiseParallel()},
          {"blocks.*.attn.proj", tp::RowwiseParallel()},
          {"blocks.*.mlp.fc1", tp::ColwiseParallel()},
          {"blocks.*.mlp.fc2", tp::RowwiseParallel()},
          {"head", tp::ColwiseParallel()}};
}

// Sequence parallelism besides: the norms run on sequence shards, the block inputs are gathered
// at attention and MLP, the row-wise outputs reduce-scattered along the sequence.
tp::Plan sequence_parallel_plan() {
  const auto seq = Placement::shard(1), rep = Placement::replicate();
  return {{"tok", tp::RowwiseParallel()},
          {"blocks.0", tp::PrepareModuleInput().input_layouts({rep}).desired_input_layouts({seq})},
          {"blocks.*.ln[12]", tp::SequenceParallel()},
          {"blocks.*.attn", tp::PrepareModuleInput().input_layouts({seq}).desired_input_layouts({rep})},
          {"blocks.*.attn.[qkv]", tp::ColwiseParallel()},
          {"blocks.*.attn.proj", tp::RowwiseParallel().output_layout(seq)},
          {"blocks.*.mlp", tp::PrepareModuleInput().input_layouts({seq}).desired_input_layouts({rep})},
          {"blocks.*.mlp.fc1", tp::ColwiseParallel()},
          {"blocks.*.mlp.fc2", tp::RowwiseParallel().output_layout(seq)},
          {"ln_f", tp::SequenceParallel()},
          {"head", tp::ColwiseParallel().input_layout(seq)}};
}

// The layouts the two plans above leave out: a column-wise embedding gathered whole, an MLP whose
// first layer's output is gathered and whose second takes its chunk of it, a block's output cut
// along the sequence by PrepareModuleOutput, and the head all-gathering its sequence-sharded input.
tp::Plan other_layouts_plan() {
  const auto seq = Placement::shard(1), rep = Placement::replicate();
  return {{"tok", tp::ColwiseParallel().output_layout(rep)},
          {"blocks.*.attn.[qkv]", tp::ColwiseParallel()},
          {"blocks.*.attn.proj", tp::RowwiseParallel()},
          {"blocks.*.mlp.fc1", tp::ColwiseParallel().output_layout(rep)},
          {"blocks.*.mlp.fc2", tp::RowwiseParallel().input_layout(rep)},
          {"blocks.1", tp::PrepareModuleOutput().output_layout(rep).desired_output_layout(seq)},
          {"ln_f", tp::SequenceParallel()},
          {"head", tp::ColwiseParallel().input_layout(seq)}};
}

at::Tensor whole_loss(Gpt& model, const at::Tensor& x, const at::Tensor& y) {
  return at::cross_entropy_loss(model->forward(x).reshape({-1, kVocab}), y.reshape({-1}));
}
at::Tensor parallel_loss(Gpt& model, const at::Tensor& x, const at::Tensor& y, const tp::Group& group) {
  return tp::cross_entropy(model->forward(x), y, group);
}

// Weights after AdamW steps, against the single process: AdamW divides each gradient element by
// its own magnitude, so an element near zero (a sum that cancels) turns fp32 reduction-order
// error into an update error up to lr x its relative error. The absolute tolerance is 1e-3 of
// the learning rate (1e-2): far below one update, the size a misplaced piece would show. (With
// 1e-6 the check failed on an AMD EPYC, by 2.7e-6 on one element of a row-wise weight, and passed
// on the machine before: the rounding is the CPU's.)
constexpr double kWeightsAfterAdamWAtol = 1e-5;

// `piece` of a parameter placed as `placement` over `group`, joined whole.
at::Tensor joined(const at::Tensor& piece, const Placement& placement, tandem::comm::ProcessGroup& group) {
  return placement.is_shard() ? tp::detail::gather_along(piece.contiguous(), placement.dim, group) : piece;
}

void expect_replicated_bit_identical(const at::Tensor& t, tandem::comm::ProcessGroup& group, const std::string& name) {
  const auto copies = group.all_gather(t.contiguous());
  for (int r = 1; r < group.size(); ++r) EXPECT_TRUE(at::equal(copies[r], copies[0])) << name << " differs on rank " << r;
}

// One plan against the single process: loss, gradients (joined, and replicated ones the same on
// every rank), and weights after three AdamW steps.
void check_plan_against_single_process(const tp::Plan& plan, bool checkpointed = false,
                                       c10::Device device = c10::Device(c10::kCPU)) {
  auto group = shared_pg();
  Gpt reference = make_gpt();
  reference->to(device);
  Gpt model = make_gpt(checkpointed);
  model->to(device);
  const tp::Layout layout = tp::parallelize(*model, group, plan);
  torch::optim::AdamW ref_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(4, 100 + step);
    x = x.to(device);
    y = y.to(device);
    at::Tensor ref_loss = whole_loss(reference, x, y);
    at::Tensor loss = parallel_loss(model, x, y, group);
    EXPECT_TRUE(at::allclose(loss, ref_loss, 1e-5, 1e-6)) << "step " << step << ": " << loss << " vs " << ref_loss;
    ref_loss.backward();
    loss.backward();
    auto ref_params = reference->named_parameters();
    for (const auto& item : model->named_parameters()) {
      const Placement placement = layout.placement(item.key());
      const at::Tensor grad = item.value().grad();
      ASSERT_TRUE(grad.defined()) << item.key();
      EXPECT_TRUE(close_at_scale(joined(grad, placement, *group), ref_params[item.key()].grad(), 1e-4))
          << item.key() << " at step " << step;
      if (!placement.is_shard()) expect_replicated_bit_identical(grad, *group, item.key());
    }
    ref_opt.step();
    opt.step();
    ref_opt.zero_grad();
    opt.zero_grad();
  }
  auto ref_params = reference->named_parameters();
  for (const auto& item : model->named_parameters()) {
    const at::Tensor whole = joined(item.value().detach(), layout.placement(item.key()), *group);
    EXPECT_TRUE(at::allclose(whole, ref_params[item.key()], 1e-4, kWeightsAfterAdamWAtol))
        << item.key() << ": largest difference " << (whole - ref_params[item.key()]).abs().max().item<double>();
  }
  // Without autograd too (evaluation).
  at::NoGradGuard no_grad;
  auto [x, y] = batch(4, 150);
  x = x.to(device);
  y = y.to(device);
  EXPECT_TRUE(at::allclose(parallel_loss(model, x, y, group), whole_loss(reference, x, y), 1e-5, 1e-6));
}

TEST(TensorParallel, MegatronPlanEqualsOneProcess) { check_plan_against_single_process(megatron_plan()); }

// The same on CUDA (scripts/gpu-check): the plans' collectives on NCCL, the replicated-input
// check a MiB at a time on the device, the token and target checks as device-side asserts; the
// sequence-parallel plan with activation checkpointing (the recompute on the device).
TEST(TensorParallelGpu, PlansOnCudaEqualOneProcess) {
  if (!tandem::test::every_rank_has_nccl()) GTEST_SKIP() << tandem::test::why_no_nccl();
  const c10::Device cuda = *pg().cuda_device();
  check_plan_against_single_process(megatron_plan(), /*checkpointed=*/false, cuda);
  check_plan_against_single_process(sequence_parallel_plan(), /*checkpointed=*/true, cuda);
}

TEST(TensorParallel, SequenceParallelPlanEqualsOneProcess) {
  check_plan_against_single_process(sequence_parallel_plan());
}

TEST(TensorParallel, OtherLayoutsEqualOneProcess) { check_plan_against_single_process(other_layouts_plan()); }

// Checkpointed blocks: the norms' gradients are summed over the group once (their tensor hooks run
// once per backward: Note [Parameter hooks once] in src/nn/checkpoint.cpp).
TEST(TensorParallel, SequenceParallelWithActivationCheckpointingEqualsOneProcess) {
  check_plan_against_single_process(sequence_parallel_plan(), /*checkpointed=*/true);
}

TEST(TensorParallel, ThePlanCutsParametersAsPyTorchPlacesThem) {
  Gpt model = make_gpt();
  const auto layout = tp::parallelize(*model, shared_pg(), megatron_plan());
  EXPECT_EQ(layout.placement("blocks.0.attn.q.weight"), Placement::shard(0));
  EXPECT_EQ(layout.placement("blocks.0.attn.q.bias"), Placement::shard(0));
  EXPECT_EQ(layout.placement("blocks.1.mlp.fc2.weight"), Placement::shard(1));
  EXPECT_EQ(layout.placement("blocks.1.mlp.fc2.bias"), Placement::replicate());
  EXPECT_EQ(layout.placement("tok.weight"), Placement::shard(0));
  EXPECT_EQ(layout.placement("blocks.0.ln1.weight"), Placement::replicate());
  auto params = model->named_parameters();
  EXPECT_EQ(params["blocks.0.attn.q.weight"].sizes(), (std::vector<int64_t>{kDim / W(), kDim}));
  EXPECT_EQ(params["blocks.0.mlp.fc2.weight"].sizes(), (std::vector<int64_t>{kDim, 4 * kDim / W()}));
  EXPECT_EQ(params["tok.weight"].sizes(), (std::vector<int64_t>{kVocab / W(), kDim}));
  EXPECT_EQ(params["blocks.0.mlp.fc2.bias"].sizes(), (std::vector<int64_t>{kDim}));
}

// A row-wise embedding (vocabulary cut) whose output leaves cut along the sequence: joined, the
// lookup of the whole table; the gradient of the rows this rank holds, the whole table's.
TEST(TensorParallel, RowwiseEmbeddingWithASequenceShardedOutput) {
  torch::manual_seed(6);
  auto net = torch::nn::Sequential(Hookable(torch::nn::Embedding(4 * W(), 3)));
  torch::manual_seed(6);
  auto whole = torch::nn::Embedding(4 * W(), 3);
  const auto layout =
      tp::parallelize(*net, shared_pg(), {{"0", tp::RowwiseParallel().output_layout(Placement::shard(1))}});
  at::Tensor tokens = at::arange(2 * 2 * W()).remainder(4 * W()).view({2, 2 * W()});
  at::Tensor out = net->forward(tokens);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 2, 3}));
  at::Tensor ref = whole->forward(tokens);
  EXPECT_TRUE(close_at_scale(tp::detail::gather_along(out.detach(), 1, pg()), ref.detach(), 1e-5));
  at::Tensor g = at::arange(ref.numel(), at::kFloat).view(ref.sizes());
  ref.backward(g);
  out.backward(g.chunk(W(), 1)[R()].contiguous());
  auto params = net->named_parameters();
  EXPECT_EQ(layout.placement("0.weight"), Placement::shard(0));
  EXPECT_TRUE(close_at_scale(tp::detail::gather_along(params["0.weight"].grad(), 0, pg()), whole->weight.grad(), 1e-5));
}

// Note [Shared conversions]: three column-wise layers reading one tensor all-reduce their input's
// gradient once, not three times; the gradient is still the whole one.
TEST(TensorParallel, LayersReadingOneTensorShareOneAllReduce) {
  torch::manual_seed(5);
  auto three = torch::nn::Sequential(Hookable(torch::nn::Linear(4, 2 * W())), Hookable(torch::nn::Linear(4, 2 * W())),
                                     Hookable(torch::nn::Linear(4, 2 * W())));
  torch::manual_seed(5);
  auto reference = torch::nn::Sequential(torch::nn::Linear(4, 2 * W()), torch::nn::Linear(4, 2 * W()),
                                         torch::nn::Linear(4, 2 * W()));
  tp::parallelize(*three, shared_pg(), {{"*", tp::ColwiseParallel()}});
  auto run = [](torch::nn::Sequential& net, const at::Tensor& x) {
    at::Tensor sum;
    for (size_t i = 0; i < net->size(); ++i) {
      at::Tensor y = net[i]->as<tandem::nn::HookableImpl>() ? net->ptr<tandem::nn::HookableImpl>(i)->forward(x)
                                                           : net->ptr<torch::nn::LinearImpl>(i)->forward(x);
      sum = sum.defined() ? sum + y : y;
    }
    return sum;
  };
  for (int step = 0; step < 2; ++step) {  // the second step: no first-forward input check either
    at::Tensor x = at::arange(12, at::kFloat).view({3, 4}).div(7).requires_grad_();
    at::Tensor x_ref = x.detach().clone().requires_grad_();
    at::Tensor out = tp::gather_from(run(three, x), -1, shared_pg());
    const uint64_t before = pg().last_sequence_number();
    (out * out).sum().backward();
    EXPECT_EQ(pg().last_sequence_number() - before, 1u) << "collectives in backward, step " << step;
    at::Tensor ref = run(reference, x_ref);
    (ref * ref).sum().backward();
    EXPECT_TRUE(close_at_scale(x.grad(), x_ref.grad(), 1e-5));
  }
}

// TP within pairs, FSDP across them: mesh (dp 2, tp 2) at 4 processes. Each dp coordinate trains
// on its half of the batch; the oracle is one process on the whole batch.
// SGD's step is the gradient's (a gradient off by a factor shows); AdamW's is the oracle.
template <typename Optimizer, typename Options>
void check_tp_fsdp_against_single_process(Options options) {
  tandem::comm::DeviceMesh mesh(shared_pg(), {2, 2}, {"dp", "tp"});
  const int dp = mesh.local_rank("dp");
  auto tp_group = mesh["tp"].group();
  Gpt reference = make_gpt();
  Gpt net = make_gpt();
  const tp::Layout layout = tp::parallelize(*net, mesh["tp"], megatron_plan());
  tandem::fsdp::FullyShardedDataParallel model(net, mesh["dp"]);
  Optimizer ref_opt(reference->parameters(), options);
  Optimizer opt(model->shard_parameters(), options);
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(4, 200 + step);
    at::Tensor ref_loss = whole_loss(reference, x, y);
    ref_loss.backward();
    ref_opt.step();
    ref_opt.zero_grad();
    at::Tensor mine_x = x.chunk(2, 0)[dp], mine_y = y.chunk(2, 0)[dp];
    at::Tensor loss = tp::cross_entropy(model->forward(mine_x), mine_y, tp_group);
    at::Tensor both = loss.detach().clone().view({1});
    mesh["dp"].group()->all_reduce(both);
    EXPECT_TRUE(at::allclose(both / 2, ref_loss, 1e-5, 1e-6)) << "step " << step;
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  auto ref_params = reference->named_parameters();
  for (const auto& [name, whole_over_dp] : model->gather_parameters()) {
    EXPECT_TRUE(at::allclose(joined(whole_over_dp, layout.placement(name), *tp_group), ref_params[name], 1e-4,
                             kWeightsAfterAdamWAtol))
        << name;
  }
}

TEST(TensorParallel, WithFsdpOnATwoByTwoMeshEqualsOneProcess) {
  if (W() != 4) GTEST_SKIP() << "a 2 x 2 mesh takes 4 processes";
  check_tp_fsdp_against_single_process<torch::optim::SGD>(torch::optim::SGDOptions(0.5));
  check_tp_fsdp_against_single_process<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2));
}

// The checkpoint of a tensor-parallel job (Note [Checkpoints under tensor parallelism]): its pieces
// put together are the single process's weights and AdamW state; a job without tensor
// parallelism (every process data-parallel, under the other strategy) loads it and holds the
// single process's model, and its next step is the single process's next step; that job's own
// checkpoint, loaded by a tensor-parallel job again, gives the same model.
std::vector<std::string> files_of(const std::string& folder, const std::string& prefix) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.size() > 12 && name.substr(name.size() - 12) == ".safetensors") {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

template <typename Model>
at::Tensor loss_on_every_rank(Model& model, const at::Tensor& x, const at::Tensor& y, const tp::Group& tp_group) {
  at::Tensor logits = model->forward(x);
  return tp_group ? tp::cross_entropy(logits, y, tp_group)
                  : at::cross_entropy_loss(logits.reshape({-1, kVocab}), y.reshape({-1}));
}
// The same without autograd (DDP's reducer expects a backward after a forward that records one).
template <typename Model>
at::Tensor evaluated(Model& model, const at::Tensor& x, const at::Tensor& y, const tp::Group& tp_group) {
  at::NoGradGuard no_grad;
  at::Tensor logits = model->forward(x);
  return tp_group ? tp::cross_entropy(logits, y, tp_group)
                  : at::cross_entropy_loss(logits.reshape({-1, kVocab}), y.reshape({-1}));
}

void check_checkpoint_against_single_process(tandem::Accelerator& acc, const at::Tensor& x_all, const at::Tensor& y_all,
                                             int64_t per_rank, tandem::Strategy strategy,
                                             const tandem::ParallelismConfig& parallelism, Gpt& reference,
                                             torch::optim::AdamW& ref_opt) {
  at::AutoGradMode grad_mode(true);  // the caller checked its model without autograd
  const std::string saved = acc.save_state(tandem::test::shared_temp_folder("tandem-tp-ckpt"));
  {
    const tandem::accelerate::ShardedTensors weights(files_of(saved, "model_0"), "model"),
        state(files_of(saved, "optimizer_0"), "optimizer");
    for (const auto& item : reference->named_parameters()) {
      const std::string& name = item.key();
      EXPECT_TRUE(at::allclose(weights.whole(name), item.value(), 1e-4, kWeightsAfterAdamWAtol))
          << name << ": largest difference " << (weights.whole(name) - item.value()).abs().max().item<double>();
      const auto& adamw = static_cast<const torch::optim::AdamWParamState&>(
          *ref_opt.state().at(item.value().unsafeGetTensorImpl()));
      EXPECT_TRUE(close_at_scale(state.whole(name + ".exp_avg"), adamw.exp_avg(), 1e-3, 1e-7)) << name;
      EXPECT_TRUE(close_at_scale(state.whole(name + ".exp_avg_sq"), adamw.exp_avg_sq(), 1e-3, 1e-10)) << name;
      EXPECT_EQ(state.whole(name + ".step").item<int64_t>(), adamw.step()) << name;
    }
  }
  const auto other = strategy == tandem::Strategy::Ddp ? tandem::Strategy::Fsdp : tandem::Strategy::Ddp;
  tandem::Accelerator whole(shared_pg(), tandem::AcceleratorOptions().strategy(other).progress(false));
  auto model = whole.prepare_model(make_gpt());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  whole.prepare_optimizer(opt);
  auto loader = whole.prepare_data(x_all, y_all, per_rank, /*shuffle=*/false);
  whole.load_state(saved);
  auto [x, y] = batch(2 * W(), 460);
  EXPECT_TRUE(at::allclose(evaluated(model, x, y, nullptr), whole_loss(reference, x, y), 1e-4, 1e-6));
  // One more step on both, each process on its share: the moments and the step count came back.
  at::Tensor ref_loss = whole_loss(reference, x, y);
  ref_loss.backward();
  ref_opt.step();
  ref_opt.zero_grad();
  whole.backward(loss_on_every_rank(model, x.chunk(W(), 0)[R()], y.chunk(W(), 0)[R()], nullptr));
  whole.step(opt);
  whole.zero_grad(opt);
  auto [x2, y2] = batch(4, 470);
  EXPECT_TRUE(at::allclose(evaluated(model, x2, y2, nullptr), whole_loss(reference, x2, y2), 1e-4, 1e-6));
  // And back: the whole job's checkpoint, loaded by a tensor-parallel one.
  const std::string saved_whole = whole.save_state(tandem::test::shared_temp_folder("tandem-tp-ckpt-whole"));
  tandem::Accelerator cut(shared_pg(),
                          tandem::AcceleratorOptions().strategy(strategy).parallelism(parallelism).progress(false));
  auto cut_model = cut.prepare_model(make_gpt(), megatron_plan());
  torch::optim::AdamW cut_opt(cut_model->parameters(), torch::optim::AdamWOptions(1e-2));
  cut.prepare_optimizer(cut_opt);
  auto cut_loader = cut.prepare_data(x_all, y_all, per_rank, /*shuffle=*/false);
  cut.load_state(saved_whole);
  EXPECT_TRUE(at::allclose(evaluated(cut_model, x2, y2, cut.tensor_parallel_group()),
                           whole_loss(reference, x2, y2), 1e-4, 1e-6));
  // Its AdamW state came back as pieces too: one more step on both, each data-parallel rank on its share.
  at::Tensor ref_loss2 = whole_loss(reference, x2, y2);
  ref_loss2.backward();
  ref_opt.step();
  ref_opt.zero_grad();
  const int64_t dp = cut.data_parallel_size(), dp_rank = cut.data_parallel_rank();
  cut.backward(loss_on_every_rank(cut_model, x2.chunk(dp, 0)[dp_rank], y2.chunk(dp, 0)[dp_rank],
                                  cut.tensor_parallel_group()));
  cut.step(cut_opt);
  cut.zero_grad(cut_opt);
  EXPECT_TRUE(at::allclose(evaluated(cut_model, x, y, cut.tensor_parallel_group()), whole_loss(reference, x, y), 1e-4,
                           1e-6));
  pg().barrier();
  if (R() == 0) {
    std::filesystem::remove_all(std::filesystem::path(saved).parent_path());
    std::filesystem::remove_all(std::filesystem::path(saved_whole).parent_path());
  }
}

// The Accelerator with tp_size 2 (and DDP or FSDP over what is left): each data-parallel rank
// trains on its share of every global batch; one process trains on the whole of it. Gradient
// clipping is active (max_norm below the norms), so the norm each step returns checks every
// gradient piece counted once (Note [Clipping over layouts]); the second step clips
// by the inf-norm.
void check_accelerator_against_single_process(tandem::Strategy strategy,
                                              tandem::ParallelismConfig parallelism = tandem::ParallelismConfig().tp_size(2)) {
  tandem::Accelerator acc(shared_pg(),
                          tandem::AcceleratorOptions().strategy(strategy).parallelism(parallelism).progress(false));
  const int dp = acc.data_parallel_size();
  ASSERT_EQ(dp, W() / 2);
  ASSERT_EQ(acc.data_parallel_rank(), R() / 2);
  // A tensor-parallel pair shares its items: 2 x dp of them, 2 to each data-parallel rank.
  std::vector<int> items(2 * dp);
  for (int i = 0; i < 2 * dp; ++i) items[i] = i;
  EXPECT_EQ(acc.split_between_processes(items), (std::vector<int>{2 * (R() / 2), 2 * (R() / 2) + 1}));
  Gpt reference = make_gpt();
  auto model = acc.prepare_model(make_gpt(), megatron_plan());
  torch::optim::AdamW ref_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  acc.prepare_optimizer(opt);
  const int64_t per_rank = 2, steps = 3;
  auto [x_all, y_all] = batch(per_rank * dp * steps, 400);
  auto loader = acc.prepare_data(x_all, y_all, per_rank, /*shuffle=*/false);
  int step = 0;
  for (auto& b : loader) {
    // Rank r's batch i is samples r + dp * (2i, 2i + 1): the global batch i is a block of 2 dp.
    at::Tensor ref_loss = whole_loss(reference, x_all.narrow(0, step * per_rank * dp, per_rank * dp),
                                     y_all.narrow(0, step * per_rank * dp, per_rank * dp));
    ref_loss.backward();
    // The 2-norm, then the inf-norm (the largest piece wins: a max across the group, not a sum),
    // each clipped to half of what it is, so the clip always bites.
    const double norm_type = step == 1 ? std::numeric_limits<double>::infinity() : 2.0;
    const double unclipped = torch::nn::utils::clip_grad_norm_(reference->parameters(), 1e30, norm_type);
    ASSERT_GT(unclipped, 0) << "step " << step << ": a zero gradient cannot show the clip biting";
    const double max_norm = unclipped / 2;
    const double ref_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm, norm_type);
    ref_opt.step();
    ref_opt.zero_grad();
    auto sync = acc.accumulate(model);
    acc.backward(tp::cross_entropy(model->forward(b.data), b.target, acc.tensor_parallel_group()));
    const double norm = acc.clip_grad_norm(model->parameters(), max_norm, norm_type);
    EXPECT_NEAR(norm, ref_norm, 1e-4 * ref_norm) << "step " << step << ", norm_type " << norm_type;
    acc.step(opt);
    acc.zero_grad(opt);
    ++step;
  }
  EXPECT_EQ(step, steps);
  at::NoGradGuard no_grad;
  auto [x, y] = batch(4, 450);
  EXPECT_TRUE(at::allclose(tp::cross_entropy(model->forward(x), y, acc.tensor_parallel_group()),
                           whole_loss(reference, x, y), 1e-4, 1e-6));
  EXPECT_ERROR(acc.prepare_model(make_gpt()), "prepare_model: tp_size 2 cuts the model's layers by a plan: call "
                                             "prepare_model(model, plan) (tandem/tp/parallelize.h)");
  check_checkpoint_against_single_process(acc, x_all, y_all, per_rank, strategy, parallelism, reference, ref_opt);
}

// Megatron's seeding (tandem/tp/random.h): a tensor-parallel group draws alike outside a
// nn::RegionRng (dropout on what it holds whole) and apart inside one (on what it holds cut).
TEST(AcceleratorTensorParallel, TheGroupDrawsAlikeOutsideTheRegionAndApartInside) {
  if (W() < 2) GTEST_SKIP() << "needs a group of two";
  tandem::Accelerator acc(shared_pg(), tandem::AcceleratorOptions().seed(5).progress(false).parallelism(
                                           tandem::ParallelismConfig().tp_size(2)));
  const at::Tensor outside = at::rand({4});
  at::Tensor inside;
  {
    tandem::nn::RegionRng region;
    inside = at::rand({4});
  }
  const auto outsides = shared_pg()->all_gather(outside), insides = shared_pg()->all_gather(inside);
  const int partner = R() ^ 1;  // the mesh is (replicate, shard, tp): tp pairs are {0, 1}, {2, 3}
  EXPECT_TRUE(at::equal(outsides[static_cast<size_t>(partner)], outside));
  EXPECT_FALSE(at::equal(insides[static_cast<size_t>(partner)], inside));
  torch::manual_seed(tandem::tp::region_seed(5, acc.parallel_ranks()));
  EXPECT_TRUE(at::equal(at::rand({4}), inside)) << "the region's seed: Megatron's offset 2718 + the tp rank";
}

TEST(AcceleratorTensorParallel, DdpOverTheRestEqualsOneProcess) {
  if (W() % 2 != 0) GTEST_SKIP() << "tp_size 2 takes an even number of processes";
  check_accelerator_against_single_process(tandem::Strategy::Ddp);
}

TEST(AcceleratorTensorParallel, FsdpOverTheRestEqualsOneProcess) {
  if (W() % 2 != 0) GTEST_SKIP() << "tp_size 2 takes an even number of processes";
  check_accelerator_against_single_process(tandem::Strategy::Fsdp);
}

// HSDP under the pairs: two replicas of one shard each, so the checkpoint's pieces come from the
// first replica only and the norm counts them once.
TEST(AcceleratorTensorParallel, HsdpOverTheRestEqualsOneProcess) {
  if (W() != 4) GTEST_SKIP() << "replicate 2 x shard 1 x tp 2 takes 4 processes";
  check_accelerator_against_single_process(tandem::Strategy::Fsdp,
                                           tandem::ParallelismConfig().replicate_size(2).shard_size(1).tp_size(2));
}

// fp16 under tensor parallelism: the scaler's overflow check covers every rank's gradient pieces.
// An inf in one rank's piece of a cut layer (the other rank of its pair has no inf) skips the
// step on every rank and halves the scale on every rank; the step before and after it train.
TEST(AcceleratorTensorParallel, Fp16OverflowInOneRanksPieceSkipsTheStepEverywhere) {
  if (W() % 2 != 0) GTEST_SKIP() << "tp_size 2 takes an even number of processes";
  tandem::Accelerator acc(shared_pg(), tandem::AcceleratorOptions()
                                           .strategy(tandem::Strategy::Ddp)
                                           .mixed_precision(tandem::Precision::Fp16)
                                           // A scale the model's gradients never overflow at: only the
                                           // planted inf skips a step.
                                           .scaler(tandem::amp::GradScalerOptions().init_scale(64))
                                           .parallelism(tandem::ParallelismConfig().tp_size(2))
                                           .progress(false));
  auto model = acc.prepare_model(make_gpt(), megatron_plan());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  acc.prepare_optimizer(opt);
  ASSERT_NE(acc.scaler(), nullptr);
  auto weights = [&] {
    std::vector<at::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  };
  auto same = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!at::equal(a[i], b[i])) return false;
    }
    return true;
  };
  const int dp_rank = acc.data_parallel_rank();
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(2, 480 + static_cast<uint64_t>(10 * step + dp_rank));
    const auto before = weights();
    const double scale = acc.scaler()->get_scale();
    acc.backward(tp::cross_entropy(model->forward(x), y, acc.tensor_parallel_group()));
    if (step == 1 && R() == 1) {  // rank 1 alone: its piece of one cut weight overflows
      for (const auto& item : model->named_parameters()) {
        if (item.key().find("fc1.weight") != std::string::npos && item.value().grad().defined()) {
          item.value().grad().view(-1)[0] = std::numeric_limits<float>::infinity();
          break;
        }
      }
    }
    acc.step(opt);
    acc.zero_grad(opt);
    const bool skipped = same(before, weights());
    EXPECT_EQ(skipped, step == 1) << "step " << step << " on rank " << R();
    EXPECT_EQ(acc.scaler()->get_scale(), step == 1 ? scale / 2 : scale) << "step " << step << " on rank " << R();
    // Every rank agrees: the count of ranks that skipped is 0 or all of them.
    at::Tensor skips = at::tensor({skipped ? 1.0 : 0.0}, at::kDouble);
    pg().all_reduce(skips);
    EXPECT_EQ(skips.item<double>(), step == 1 ? W() : 0.0) << "step " << step;
  }
}

// ---------------------------------------------------------------------------------------------
// Bad plans: one line each, on every rank, no hang.

TEST(TensorParallelErrors, ANameThatMatchesNothing) {
  Gpt model = make_gpt();
  const std::string error =
      tandem::test::error_of([&] { tp::parallelize(*model, shared_pg(), {{"blocks.*.attn.wq", tp::ColwiseParallel()}}); });
  EXPECT_THAT(error, ::testing::StartsWith("tp: the plan's 'blocks.*.attn.wq' matches no module of "));
  EXPECT_THAT(error, ::testing::EndsWith("Gpt (its modules: 'tok', 'blocks', 'blocks.0', 'blocks.0.ln1', ...)"));
}

TEST(TensorParallelErrors, AModuleThatIsNotHookable) {
  Gpt model = make_gpt();
  EXPECT_ERROR(tp::parallelize(*model, shared_pg(), {{"blocks", tp::ColwiseParallel()}}),
               "tp: 'blocks' (torch::nn::Sequential) is not a tandem::nn::Hookable: declare it as "
               "tandem::nn::Hookable(...) (inside a Unit or Checkpoint if it has one) so that the plan can run its "
               "collectives around its forward");
}

TEST(TensorParallelErrors, AModuleMatchedTwiceOrStyledWrong) {
  Gpt model = make_gpt();
  EXPECT_ERROR(tp::parallelize(*model, shared_pg(), {{"head", tp::ColwiseParallel()}, {"h*", tp::RowwiseParallel()}}),
               "tp: 'head' is matched by both 'head' and 'h*' in the plan: give each module one style");
  EXPECT_ERROR(tp::parallelize(*model, shared_pg(), {{"ln_f", tp::ColwiseParallel()}}),
               "tp: ColwiseParallel applies to Linear and Embedding; 'ln_f' is torch::nn::LayerNorm");
}

TEST(TensorParallelErrors, FeaturesThatDoNotDivide) {
  if (W() == 1) GTEST_SKIP() << "every size divides by 1";
  auto net = torch::nn::Sequential(Hookable(torch::nn::Linear(4, 2 * W() + 1)));
  EXPECT_ERROR(tp::parallelize(*net, shared_pg(), {{"0", tp::ColwiseParallel()}}),
               "tp: '0' has " + std::to_string(2 * W() + 1) +
                   " output features, which as a ColwiseParallel dimension of size " + std::to_string(2 * W() + 1) +
                   " does not divide among the " + std::to_string(W()) + " ranks of the tensor-parallel group");
}

TEST(TensorParallelErrors, ATensorCutTwiceAndABadPlanLeavesTheModelWhole) {
  auto shared = torch::nn::Linear(4, 2 * W());  // one module under two names: its weight is tied
  auto net = torch::nn::Sequential(Hookable(shared), Hookable(shared));
  EXPECT_ERROR(tp::parallelize(*net, shared_pg(), {{"*", tp::ColwiseParallel()}}),
               "tp: '1.weight' is a tensor the plan cuts already (a tied weight?): give tied modules one style, or "
               "untie them");
  // Note [Checked before cut]: nothing was cut, no hook set.
  EXPECT_EQ(shared->weight.sizes(), (std::vector<int64_t>{2 * W(), 4}));
  EXPECT_FALSE(net->ptr<tandem::nn::HookableImpl>(0)->has_hooks());
}

// Agreement before waiting: plans that differ between ranks stop every rank at once, naming the
// plans and the ranks (not a hang in collectives some ranks never run).
TEST(TensorParallelErrors, PlansThatDifferBetweenRanksAreOneLineOnEveryRank) {
  if (W() == 1) GTEST_SKIP() << "one rank cannot differ from itself";
  std::string others = W() == 2 ? "rank 1" : "ranks 1";
  for (int r = 2; r < W(); ++r) others += ", " + std::to_string(r);
  Gpt model = make_gpt();
  const tp::Plan plan = R() == 0 ? tp::Plan{{"head", tp::ColwiseParallel()}} : tp::Plan{{"head", tp::RowwiseParallel()}};
  EXPECT_ERROR(tp::parallelize(*model, shared_pg(), plan),
               "tp: the plan: the ranks of the world group disagree on plan: head: ColwiseParallel on rank 0; head: "
               "RowwiseParallel on " + others);
}

// PrepareModuleInput from Partial(): each rank holds a summand; the module sees the sum (as one
// process on the summed input), and each summand's gradient is the sum's.
TEST(TensorParallel, PrepareModuleInputFromPartialSumsTheSummands) {
  torch::manual_seed(3);
  auto linear = torch::nn::Linear(3, 2);
  auto net = torch::nn::Sequential(Hookable(linear));
  tp::parallelize(*net, shared_pg(),
                  {{"0", tp::PrepareModuleInput().input_layouts({Placement::partial()}).desired_input_layouts(
                             {Placement::replicate()})}});
  const at::Tensor mine = (at::arange(6, at::kFloat).view({2, 3}) + R()).requires_grad_(true);
  const at::Tensor out = net->forward(mine);
  at::Tensor whole = at::zeros({2, 3});
  for (int r = 0; r < W(); ++r) whole += at::arange(6, at::kFloat).view({2, 3}) + r;
  whole.requires_grad_(true);
  const at::Tensor expected = at::linear(whole, linear->weight.detach(), linear->bias.detach());
  EXPECT_TRUE(close_at_scale(out, expected, 1e-6));
  out.sum().backward();
  expected.sum().backward();
  EXPECT_TRUE(close_at_scale(mine.grad(), whole.grad(), 1e-6));
  EXPECT_ERROR(tp::parallelize(*torch::nn::Sequential(Hookable(torch::nn::Linear(3, 2))), shared_pg(),
                               {{"0", tp::PrepareModuleInput().input_layouts({Placement::replicate()})
                                          .desired_input_layouts({Placement::partial()})}}),
               "tp: '0': a desired input layout Partial(): a module takes Replicate() or Shard(d)");
}

TEST(TensorParallelErrors, ABatchThatDiffersAcrossTheGroup) {
  if (W() == 1) GTEST_SKIP() << "one rank cannot differ from itself";
  Gpt model = make_gpt();
  tp::parallelize(*model, shared_pg(), megatron_plan());
  auto [x, y] = batch(2, 300 + R());  // each rank its own batch: wrong under tensor parallelism
  EXPECT_ERROR(model->forward(x),
               "tp: the input of 'tok' differs across the tensor-parallel group (rank 1 has another than rank 0): "
               "every rank of a tp group must run on the same batch; shard the data over the data-parallel "
               "dimensions only");
}

}  // namespace

int main(int argc, char** argv) { return tandem::test::distributed_test_main(argc, argv); }
