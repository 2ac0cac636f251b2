// Accelerator oracles. The same binary runs as a world of one (strategies single, dp over two CPU
// replicas, ddp at world 1) and as every rank of 2- and 4-rank jobs (ddp). Every test compares
// against a reference trained in-process without the Accelerator.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>

#include <ATen/ATen.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include "support/compare.h"
#include "support/distributed_main.h"
#include "support/errors.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/nn/region_rng.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/comm/cuda_info.h"
#include "tandem/data/distributed_sampler.h"

using namespace tandem;

namespace {

constexpr int64_t kGlobalBatch = 24;  // divisible by 1, 2, 3, 4
constexpr int64_t kSamples = 240;     // 10 steps per epoch

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  NetImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(fc1(x).tanh()); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

struct Data {
  at::Tensor x, y;
};
Data dataset(int64_t n = kSamples) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  return {at::randn({n, 8}, gen), at::randint(0, 3, {n}, gen)};
}

int W() { return test::pg().size(); }
bool acc_main() { return test::pg().rank() == 0; }

// The sampler's order for world 1, epoch by epoch: the global batches every strategy must see.
std::vector<int64_t> global_order(uint64_t seed, int64_t epoch, int64_t n = kSamples) {
  data::DistributedSampler sampler(n, 1, 0, data::DistributedSamplerOptions().seed(seed));
  sampler.set_epoch(epoch);
  return sampler.indices();
}

// Plain SGD on the global batches, `steps` steps of `accumulation` batches of kGlobalBatch.
std::vector<at::Tensor> reference(int steps, uint64_t seed, int accumulation = 1) {
  torch::manual_seed(seed);  // rank 0's seed: its initial weights are everyone's
  Net net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Data d = dataset();
  int64_t epoch = 0, cursor = 0;
  auto order = global_order(seed, 0);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    for (int a = 0; a < accumulation; ++a) {
      if (cursor == kSamples) {
        order = global_order(seed, ++epoch);
        cursor = 0;
      }
      at::Tensor idx = at::tensor(std::vector<int64_t>(order.begin() + cursor, order.begin() + cursor + kGlobalBatch));
      cursor += kGlobalBatch;
      (at::cross_entropy_loss(net->forward(d.x.index_select(0, idx)), d.y.index_select(0, idx)) / accumulation).backward();
    }
    opt.step();
  }
  std::vector<at::Tensor> params;
  for (auto& p : net->parameters()) params.push_back(p.detach().clone());
  return params;
}

AcceleratorOptions options_for(Strategy strategy) {
  auto o = AcceleratorOptions().strategy(strategy).seed(5).progress(false);
  if (strategy == Strategy::DataParallel) o.dp(dp::DataParallelOptions().devices({c10::kCPU, c10::kCPU}));
  return o;
}

struct StrategyCase {
  std::string name;
  Strategy strategy;
};
void PrintTo(const StrategyCase& c, std::ostream* out) { *out << c.name; }
class AcceleratorOracle : public ::testing::TestWithParam<StrategyCase> {};

// The same loop, whatever was launched: parameters after 20 steps equal plain SGD on the global
// batches (two epochs: the second reshuffled).
TEST_P(AcceleratorOracle, TwentyStepsEqualPlainSgdOnTheGlobalBatches) {
  const auto& c = GetParam();
  if (c.strategy != Strategy::Ddp && W() > 1) GTEST_SKIP() << c.name << " runs in one process";
  Accelerator acc(test::shared_pg(), options_for(c.strategy));
  Net net;
  auto model = acc.prepare_model(net);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  acc.prepare_optimizer(opt);
  Data d = dataset();
  const int64_t per_process = c.strategy == Strategy::Ddp ? kGlobalBatch / W() : kGlobalBatch;
  auto loader = acc.prepare_data(d.x, d.y, per_process);
  ASSERT_EQ(loader.batches_per_epoch(), 10);
  int steps = 0;
  while (steps < 20) {
    for (auto& batch : loader) {
      auto sync = acc.accumulate(model);
      acc.backward(at::cross_entropy_loss(model->forward(batch.data), batch.target));
      acc.step(opt);
      acc.zero_grad(opt);
      ++steps;
    }
  }
  EXPECT_EQ(acc.completed_steps(), 20);
  EXPECT_EQ(loader.epoch(), 2);
  const double diff = test::max_relative_difference(acc.unwrap(model)->parameters(), reference(20, 5));
  std::printf("accelerator %s on %d process(es), %s: max relative difference %.3g\n", c.name.c_str(), W(),
              acc.strategy_reason().c_str(), diff);
  EXPECT_LE(diff, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Table, AcceleratorOracle,
                         ::testing::Values(StrategyCase{"single", Strategy::Single},
                                           StrategyCase{"dp_2cpu", Strategy::DataParallel},
                                           StrategyCase{"ddp", Strategy::Ddp}),
                         [](const auto& info) { return info.param.name; });

// accumulate(k) on batches of b equals one step on batches of k*b; the optimizer steps only on
// every k-th batch (counted).
TEST(AcceleratorAccumulation, KBatchesEqualOneKTimesLargerBatch) {
  constexpr int k = 3;
  Accelerator acc(test::shared_pg(), AcceleratorOptions().seed(5).gradient_accumulation_steps(k).progress(false));
  Net net;
  auto model = acc.prepare_model(net);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  acc.prepare_optimizer(opt);
  Data d = dataset();
  // 240 samples, 8 per process-batch... per step the global batch is kGlobalBatch * k.
  auto loader = acc.prepare_data(d.x, d.y, kGlobalBatch / W());
  int batches = 0, stepped = 0;
  for (auto& batch : loader) {
    if (batches == 9) break;  // 3 optimizer steps
    auto sync = acc.accumulate(model);
    acc.backward(at::cross_entropy_loss(model->forward(batch.data), batch.target));
    const double norm = acc.clip_grad_norm(model->parameters(), 1e9);  // measures only
    if (acc.sync_gradients()) {  // the same norm on every rank: the gradients were averaged first
      at::Tensor norms = acc.gather(at::tensor({norm}, at::kDouble));
      EXPECT_GT(norm, 0);
      for (int r = 1; r < W(); ++r) EXPECT_EQ(norms[r].item<double>(), norms[0].item<double>());
    } else {
      EXPECT_EQ(norm, 0);  // between synchronisations clipping does nothing
    }
    if (acc.step(opt)) ++stepped;
    acc.zero_grad(opt);
    ++batches;
  }
  EXPECT_EQ(stepped, 3);
  EXPECT_EQ(acc.completed_steps(), 3);
  const double diff = test::max_relative_difference(acc.unwrap(model)->parameters(), reference(3, 5, k));
  std::printf("accumulate(%d) on %d process(es): max relative difference %.3g\n", k, W(), diff);
  EXPECT_LE(diff, 1e-5);
}

// Uneven inputs by hand: process r has 2 + r batches of its own. The reference sums, per step, the
// gradients of the processes that still have data and divides by the world size (DDP's join).
TEST(AcceleratorJoin, UnevenInputsEqualTheReference) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions().seed(5).progress(false));
  Net net;
  auto model = acc.prepare_model(net);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  acc.prepare_optimizer(opt);
  auto batch_of = [](int rank, int step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + 10 * rank + step);
    return Data{at::randn({6, 8}, gen), at::randint(0, 3, {6}, gen)};
  };
  const int rank = test::pg().rank(), mine = 2 + rank, longest = 2 + W() - 1;
  const int64_t stood_in = model->join_uneven_inputs([&] {
    for (int step = 0; step < mine; ++step) {
      Data b = batch_of(rank, step);
      acc.backward(at::cross_entropy_loss(model->forward(b.x), b.y));
      acc.step(opt);
      acc.zero_grad(opt);
    }
  });
  EXPECT_EQ(stood_in, longest - mine);

  torch::manual_seed(5);  // rank 0's seed: its initial weights are everyone's
  Net reference;
  torch::optim::SGD reference_opt(reference->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < longest; ++step) {
    reference_opt.zero_grad();
    for (int r = 0; r < W(); ++r) {
      if (step >= 2 + r) continue;
      Data b = batch_of(r, step);
      (at::cross_entropy_loss(reference->forward(b.x), b.y) / W()).backward();
    }
    reference_opt.step();
  }
  const double diff = test::max_relative_difference(acc.unwrap(model)->parameters(), reference->parameters());
  std::printf("join_uneven_inputs on %d process(es): max relative difference %.3g\n", W(), diff);
  EXPECT_LE(diff, 1e-5);
  std::vector<at::Tensor> flat;
  for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
  auto everywhere = test::pg().all_gather(at::cat(flat));
  for (int r = 1; r < W(); ++r) EXPECT_TRUE(at::equal(everywhere[0], everywhere[r])) << "process " << r << " differs";
}

// The last batch of the data always synchronises, whatever k (accelerate's rule).
TEST(AcceleratorAccumulation, TheLastBatchOfTheDataSyncs) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions().gradient_accumulation_steps(4).progress(false));
  Net net;
  auto model = acc.prepare_model(net);
  Data d = dataset();
  auto loader = acc.prepare_data(d.x, d.y, kGlobalBatch / W());  // 10 batches: syncs at 4, 8 and 10
  std::vector<int> synced;
  int b = 0;
  for (auto& batch : loader) {
    ++b;
    auto sync = acc.accumulate(model);
    acc.backward(at::cross_entropy_loss(model->forward(batch.data), batch.target));
    if (acc.sync_gradients()) synced.push_back(b);
  }
  EXPECT_EQ(synced, (std::vector<int>{4, 8, 10}));
}

// gather_for_metrics over a dataset that does not divide evenly: exactly the dataset, in order.
TEST(AcceleratorMetrics, GatherForMetricsReturnsTheDatasetInOrder) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions().progress(false));
  constexpr int64_t n = 37;
  at::Tensor index = at::arange(n, at::kLong);
  auto loader = acc.prepare_data(index.to(at::kFloat).unsqueeze(1), index, /*batch_size=*/4, /*shuffle=*/false);
  std::vector<at::Tensor> seen;
  for (auto& batch : loader) seen.push_back(acc.gather_for_metrics(batch.target));
  at::Tensor all = at::cat(seen);
  EXPECT_TRUE(at::equal(all, index)) << all;
}

TEST(AcceleratorUtilities, GatherReduceSplitAndMainProcessFirst) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions().progress(false));
  const int r = acc.process_index();
  at::Tensor mine = at::full({2}, r, at::kLong);
  at::Tensor all = acc.gather(mine);
  ASSERT_EQ(all.size(0), 2 * W());
  for (int k = 0; k < W(); ++k) EXPECT_EQ(all[2 * k].item<int64_t>(), k);
  EXPECT_EQ(acc.reduce(at::ones({1})).item<float>(), static_cast<float>(W()));
  // 10 items over W processes: contiguous shares, the first ones one longer.
  std::vector<int> items(10);
  for (int i = 0; i < 10; ++i) items[static_cast<size_t>(i)] = i;
  auto share = acc.split_between_processes(items);
  auto sizes = acc.gather(at::tensor({static_cast<int64_t>(share.size()), share.empty() ? -1 : static_cast<int64_t>(share[0])}));
  int64_t expected_start = 0;
  for (int k = 0; k < W(); ++k) {
    EXPECT_EQ(sizes[2 * k + 1].item<int64_t>(), expected_start);
    expected_start += sizes[2 * k].item<int64_t>();
  }
  EXPECT_EQ(expected_start, 10);
  // main_process_first: the main process writes a file before any other reads it.
  const std::string path = "/tmp/tandem-mpf-" + std::to_string(getppid());
  {
    auto first = acc.main_process_first();
    if (acc.is_main_process()) std::ofstream(path) << "ready";
    std::ifstream in(path);
    std::string word;
    in >> word;
    EXPECT_EQ(word, "ready");
  }
  acc.wait_for_everyone();
  if (acc.is_main_process()) std::remove(path.c_str());
}

// A LibTorch dataset (examples one by one, stacked by the loader) gives the batches that the
// same data as plain tensors gives.
struct Pairs : torch::data::datasets::Dataset<Pairs> {
  Data d = dataset();
  torch::data::Example<> get(size_t i) override { return {d.x[static_cast<int64_t>(i)], d.y[static_cast<int64_t>(i)]}; }
  std::optional<size_t> size() const override { return static_cast<size_t>(d.x.size(0)); }
};

TEST(AcceleratorData, ALibTorchDatasetBatchesLikePlainTensors) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions().progress(false));
  Data d = dataset();
  auto tensors = acc.prepare_data(d.x, d.y, 5);
  auto examples = acc.prepare_data(Pairs(), 5);
  auto a = tensors.begin();
  auto b = examples.begin();
  int batches = 0;
  for (; a != tensors.end() && b != examples.end(); ++a, ++b, ++batches) {
    EXPECT_TRUE(at::equal(a->data, b->data));
    EXPECT_TRUE(at::equal(a->target, b->target));
  }
  EXPECT_EQ(batches, (kSamples / W() + 4) / 5);
  EXPECT_TRUE(a == tensors.end() && b == examples.end());
}

TEST(AcceleratorUtilities, LogAppendsJsonLinesOnTheMainProcess) {
  const std::string dir = "/tmp/tandem-acc-log-" + std::to_string(getppid());
  Accelerator acc(test::shared_pg(), AcceleratorOptions().progress(false).project_dir(dir));
  if (acc.is_main_process()) (void)!std::system(("rm -rf " + dir).c_str());
  acc.log({{"loss", 0.5}, {"accuracy", 0.25}}, 10);
  acc.log({{"loss", 0.25}}, 20);
  if (acc.is_main_process()) {
    std::ifstream in(dir + "/metrics.jsonl");
    std::string first, second, third;
    std::getline(in, first);
    std::getline(in, second);
    EXPECT_EQ(first, "{\"accuracy\":0.25,\"loss\":0.5,\"step\":10}");
    EXPECT_EQ(second, "{\"loss\":0.25,\"step\":20}");
    EXPECT_FALSE(std::getline(in, third));
    (void)!std::system(("rm -rf " + dir).c_str());
  }
}

TEST(AcceleratorDevices, ARankWithoutItsGpuIsNamed) {
  EXPECT_EQ(comm::device_for_local_rank(1, 2), 1);
  EXPECT_ERROR(comm::device_for_local_rank(3, 2),
               "LOCAL_RANK=3 has no CUDA device: 2 visible (one device per rank on a node: start at most 2 workers per "
               "node, or check CUDA_VISIBLE_DEVICES)");
}

TEST(AcceleratorErrors, BadOptionsAreNamed) {
  EXPECT_ERROR(Accelerator(test::shared_pg(), AcceleratorOptions().gradient_accumulation_steps(0)),
               "Accelerator: gradient_accumulation_steps must be >= 1 (got 0)");
  if (W() > 1) {
    EXPECT_ERROR(Accelerator(test::shared_pg(), AcceleratorOptions().strategy(Strategy::Single)),
                 "Accelerator: strategy single runs in one process, but " + std::to_string(W()) +
                     " processes launched by torchrun / tandem run: use Strategy::Ddp (or Auto), or start one process");
  }
}

// fp16: an inf in one rank's gradients makes every rank skip that step and back the scale off.
TEST(AcceleratorMixedPrecision, AnInfOnOneRankSkipsTheStepEverywhere) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions().mixed_precision(Precision::Fp16).progress(false)
                                         .scaler(amp::GradScalerOptions().init_scale(1024).growth_interval(100)));
  Net net;
  auto model = acc.prepare_model(net);
  torch::optim::SGD opt(model->parameters(), 0.1);
  acc.prepare_optimizer(opt);
  Data d = dataset();
  auto loader = acc.prepare_data(d.x, d.y, kGlobalBatch / W());
  std::vector<double> scales;
  std::vector<bool> skipped;
  int b = 0;
  for (auto& batch : loader) {
    if (b == 4) break;
    auto sync = acc.accumulate(model);
    at::Tensor loss = at::cross_entropy_loss(model->forward(batch.data), batch.target);
    if (b == 2 && acc.process_index() == W() - 1) loss = loss * std::numeric_limits<float>::infinity();
    acc.backward(loss);
    const double weight_before = net->fc1->weight[0][0].item<double>();
    acc.step(opt);
    skipped.push_back(acc.optimizer_step_was_skipped());
    if (acc.optimizer_step_was_skipped()) {
      EXPECT_EQ(net->fc1->weight[0][0].item<double>(), weight_before);
    }
    scales.push_back(acc.scaler()->get_scale());
    acc.zero_grad(opt);
    ++b;
  }
  EXPECT_EQ(skipped, (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 512, 512}));
}

TEST(AcceleratorMixedPrecision, Bf16RunsTheForwardUnderAutocast) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions().mixed_precision(Precision::Bf16).progress(false));
  Net net;
  auto model = acc.prepare_model(net);
  at::Tensor out = model->forward(at::randn({4, 8}));
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_EQ(net->forward(at::randn({4, 8})).scalar_type(), at::kFloat);  // outside the prepared model: off
  acc.backward(out.to(at::kFloat).sum());
  EXPECT_EQ(net->fc1->weight.grad().scalar_type(), at::kFloat);  // master weights and gradients stay fp32
}

TEST(AcceleratorCheckpoints, RegisteredObjectsAreSavedAndRestored) {
  const std::string root = "/tmp/tandem-acc-custom-" + std::to_string(getppid());
  Accelerator acc(test::shared_pg(), AcceleratorOptions().progress(false));
  std::string counter = "seen 7 batches";
  acc.register_for_checkpointing("counter", [&] { return counter; }, [&](const std::string& bytes) { counter = bytes; });
  const std::string path = acc.save_state(root);
  counter = "changed";
  acc.load_state(path);
  EXPECT_EQ(counter, "seen 7 batches");
  EXPECT_ERROR(acc.register_for_checkpointing("a/b", nullptr, nullptr),
               "register_for_checkpointing: 'a/b' is not a valid name (non-empty, no '/')");
  acc.wait_for_everyone();
  if (acc.is_main_process()) (void)!std::system(("rm -rf " + root).c_str());
}

TEST(AcceleratorProgress, APlainLineWithStepRateLossAndEta) {
  accelerate::ProgressBar bar(200, "train", /*enabled=*/true, std::tmpfile());
  bar.update(50, 6400, 0.5);
  const std::string line = bar.line();
  EXPECT_THAT(line, ::testing::StartsWith("train step 50/200 ( 25%) | "));
  EXPECT_THAT(line, ::testing::HasSubstr(" samples/s | loss 0.5000 | elapsed "));
  EXPECT_THAT(line, ::testing::HasSubstr(" | ETA "));
}

TEST(AcceleratorCheckpoints, ASaveBetweenSynchronisationsIsRefused) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions().gradient_accumulation_steps(2).progress(false));
  Net net;
  auto model = acc.prepare_model(net);
  Data d = dataset();
  auto loader = acc.prepare_data(d.x, d.y, kGlobalBatch / W());
  auto it = loader.begin();
  auto sync = acc.accumulate(model);
  acc.backward(at::cross_entropy_loss(model->forward(it->data), it->target));
  EXPECT_ERROR(acc.save_state("/tmp/never-written"),
               "save_state: called in the middle of gradient accumulation (batch 1 of 2): the accumulated gradients "
               "are not saved; call it after a batch where sync_gradients() is true");
}

// A damaged checkpoint is refused with a one-line error; the previous one still loads.
TEST(AcceleratorCheckpoints, ADamagedCheckpointIsRefusedAndThePreviousOneStillLoads) {
  const std::string root = "/tmp/tandem-acc-ckpt-" + std::to_string(getppid());
  if (acc_main()) (void)!std::system(("rm -rf " + root).c_str());
  Accelerator acc(test::shared_pg(), AcceleratorOptions().progress(false));
  Net net;
  auto model = acc.prepare_model(net);
  torch::optim::SGD opt(model->parameters(), 0.1);
  acc.prepare_optimizer(opt);
  Data d = dataset();
  auto loader = acc.prepare_data(d.x, d.y, kGlobalBatch / W());
  std::vector<std::string> saved;
  int b = 0;
  for (auto& batch : loader) {
    auto sync = acc.accumulate(model);
    acc.backward(at::cross_entropy_loss(model->forward(batch.data), batch.target));
    acc.step(opt);
    acc.zero_grad(opt);
    if (++b == 2 || b == 4) saved.push_back(acc.save_state(root));
    if (b == 4) break;
  }
  acc.wait_for_everyone();
  if (acc.process_index() == 0) {  // flip one byte of the newest checkpoint's weights
    std::fstream f(saved[1] + "/model_0.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char byte = static_cast<char>(f.get());
    f.seekp(-3, std::ios::end);
    f.put(static_cast<char>(byte ^ 0x5a));
  }
  acc.wait_for_everyone();
  EXPECT_THAT(test::error_of([&] { acc.load_state(root); }),
              ::testing::AllOf(::testing::HasSubstr("model_0.safetensors has CRC-32"),
                               ::testing::HasSubstr("the file is damaged")));
  acc.load_state(saved[0]);
  EXPECT_EQ(acc.completed_steps(), 2);
  acc.wait_for_everyone();
  if (acc.process_index() == 0) (void)!std::system(("rm -rf " + root).c_str());
}

// Auto-resume: nothing when the root is missing or holds only a writer's temporary folder (a save
// killed midway), else the newest committed checkpoint, on every rank.
TEST(AcceleratorCheckpoints, LoadStateIfAnyResumesTheNewestCommittedCheckpointOrNothing) {
  const std::string root = "/tmp/tandem-acc-auto-" + std::to_string(getppid());
  Accelerator acc(test::shared_pg(), AcceleratorOptions().progress(false));
  if (acc_main()) (void)!std::system(("rm -rf " + root).c_str());
  acc.wait_for_everyone();
  Net net;
  auto model = acc.prepare_model(net);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  acc.prepare_optimizer(opt);
  Data d = dataset();
  auto loader = acc.prepare_data(d.x, d.y, kGlobalBatch / W());
  EXPECT_FALSE(acc.load_state_if_any(root));
  if (acc_main()) (void)!std::system(("mkdir -p " + root + "/.tmp-checkpoint_000009-1 && echo x > " + root +
                                      "/.tmp-checkpoint_000009-1/model_0.safetensors").c_str());
  acc.wait_for_everyone();
  EXPECT_FALSE(acc.load_state_if_any(root));
  at::Tensor saved;
  int b = 0;
  for (auto& batch : loader) {
    auto sync = acc.accumulate(model);
    acc.backward(at::cross_entropy_loss(model->forward(batch.data), batch.target));
    acc.step(opt);
    acc.zero_grad(opt);
    if (++b == 2 || b == 3) acc.save_state(root);
    if (b == 3) saved = net->fc1->weight.detach().clone();
    if (b == 4) break;
  }
  EXPECT_FALSE(net->fc1->weight.equal(saved));
  const auto loaded = acc.load_state_if_any(root);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(*loaded, root + "/checkpoint_000003");
  EXPECT_EQ(acc.completed_steps(), 3);
  EXPECT_TRUE(net->fc1->weight.equal(saved));
  EXPECT_EQ(loader.samples_done(), 3 * kGlobalBatch);  // 3 batches of every rank: a world-size-free position
  EXPECT_EQ(loader.batches_done(), 0);                 // of the pass that continues the epoch
  acc.wait_for_everyone();
  if (acc_main()) (void)!std::system(("rm -rf " + root).c_str());
}

// Processes that see different checkpoints (no shared file system) all refuse, naming what each saw.
TEST(AcceleratorCheckpoints, LoadStateIfAnyRefusesWhenTheProcessesDisagree) {
  if (W() == 1) GTEST_SKIP() << "needs several processes";
  const std::string root = "/tmp/tandem-acc-disagree-" + std::to_string(getppid()) + "-" + std::to_string(test::pg().rank());
  (void)!std::system(("rm -rf " + root).c_str());
  Accelerator acc(test::shared_pg(), AcceleratorOptions().progress(false));
  Net net;
  auto model = acc.prepare_model(net);
  torch::optim::SGD opt(model->parameters(), 0.1);
  acc.prepare_optimizer(opt);
  if (acc_main()) {  // rank 0 alone has a checkpoint
    accelerate::CheckpointWriter writer(root, accelerate::checkpoint_name(5));
    writer.add_file("state.json", "{}");
    writer.commit();
  }
  acc.wait_for_everyone();
  EXPECT_THAT(test::error_of([&] { acc.load_state_if_any(root); }),
              ::testing::AllOf(::testing::HasSubstr("load_state_if_any: the processes see different checkpoints under " + root),
                               ::testing::HasSubstr("rank 0 checkpoint of step 5, rank 1 none"),
                               ::testing::HasSubstr("every process must see the same folder")));
  EXPECT_EQ(acc.completed_steps(), 0);
  (void)!std::system(("rm -rf " + root).c_str());
}

// ---- exact resume (run by tests/accelerate/resume_test.sh in separate processes) --------------

// phase 0: 2k steps straight; 1: k steps then save_state; 2: load_state then k more steps.
// Writes the parameters and the sample indices it consumed to OUT (one file per rank).
int resume_scenario(int phase, int k, const std::string& dir, const std::string& out) {
  Accelerator acc(test::shared_pg(), AcceleratorOptions().seed(3).gradient_accumulation_steps(2).progress(false));
  Net net;
  auto model = acc.prepare_model(net);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  acc.prepare_optimizer(opt);
  Data d = dataset(100);  // 100 samples: epochs of 13 batches of 4 at 2 ranks (the last one padded)
  auto indices = at::arange(100, at::kLong);
  auto loader = acc.prepare_data(d.x, at::stack({d.y, indices}, 1), /*batch_size=*/4);
  // Randomness drawn every batch (as dropout would): the RNG state must be restored too.
  if (phase == 2) acc.load_state(dir);
  std::vector<int64_t> consumed;
  const int batches = phase == 0 ? 2 * k : k;
  int done = 0;
  while (done < batches) {
    for (auto& batch : loader) {
      auto sync = acc.accumulate(model);
      (void)at::rand({1});
      {
        nn::RegionRng region;  // and the tensor-parallel region's, saved with the defaults
        (void)at::rand({1});
      }
      at::Tensor target = batch.target.select(1, 0);
      auto cols = batch.target.select(1, 1);
      consumed.insert(consumed.end(), cols.data_ptr<int64_t>(), cols.data_ptr<int64_t>() + cols.numel());
      acc.backward(at::cross_entropy_loss(model->forward(batch.data), target));
      acc.step(opt);
      acc.zero_grad(opt);
      if (++done == batches) break;
    }
  }
  if (phase == 1) acc.save_state(dir);
  std::ofstream file(out + ".rank" + std::to_string(acc.process_index()));
  for (auto& p : acc.unwrap(model)->parameters()) {
    at::Tensor flat = p.detach().reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      float v = flat[i].item<float>();
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      file << bits << " ";
    }
  }
  file << "\nrng " << at::rand({1}).item<float>();  // the generator's state, at the end
  {
    nn::RegionRng region;
    file << " region " << at::rand({1}).item<float>();
  }
  file << "\nsamples";
  for (auto c : consumed) file << " " << c;
  file << "\n";
  return 0;
}

}  // namespace

namespace tandem::test {
int reshard_scenario();  // reshard_scenario.cpp
}

int main(int argc, char** argv) {
  test::Scenarios scenarios;
  scenarios["reshard"] = [] { return test::reshard_scenario(); };
  for (int phase : {0, 1, 2}) {
    scenarios["resume-phase-" + std::to_string(phase)] = [phase] {
      const char* k = std::getenv("RESUME_K");
      const char* dir = std::getenv("RESUME_DIR");
      const char* out = std::getenv("RESUME_OUT");
      TANDEM_CHECK(k && dir && out, "set RESUME_K, RESUME_DIR and RESUME_OUT");
      return resume_scenario(phase, std::atoi(k), dir, out);
    };
  }
  // accelerate#2236: wait_for_everyone honours the collective timeout. Rank 1 never arrives.
  scenarios["wait-alone"] = [] {
    Accelerator acc(test::shared_pg(), AcceleratorOptions().progress(false));
    if (acc.process_index() == 1) {
      std::this_thread::sleep_for(test::pg().options().timeout() + std::chrono::seconds(10));
      return 0;
    }
    acc.wait_for_everyone();
    return 0;
  };
  return test::distributed_test_main(argc, argv, scenarios);
}
