// Optimizer state by name (Note [Optimizer state by name]): for SGD with momentum, Adam with
// amsgrad, AdamW, RMSprop (centered, with momentum) and Adagrad, each with two param groups, a
// checkpoint saved sharded (zero_stage 1) loads into a whole optimizer and the reverse, and what
// loads is bit for bit the state of the same loop run unsharded; a foreign or damaged optimizer
// file is a one-line error that names it, with nothing loaded. Part of accelerator_test (1, 2 and
// 4 ranks; 3 in accelerate.zero.gloo3). Other world sizes: tests/accelerate/reshard_test.sh.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/output-archive.h>

#include "support/distributed_main.h"
#include "support/errors.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/consolidate.h"
#include "tandem/accelerate/safetensors.h"

using namespace tandem;

namespace {

using Groups = std::vector<torch::optim::OptimizerParamGroup>;
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(Groups)>;

// Weights and biases in two groups with different hyper-parameters: `make(lr, decay)` per group.
template <typename Optimizer, typename Options>
Factory two_groups(std::function<Options(double lr, double decay)> make) {
  return [make](Groups groups) -> std::unique_ptr<torch::optim::Optimizer> {
    groups[0].set_options(std::make_unique<Options>(make(1e-2, 0.1)));
    groups[1].set_options(std::make_unique<Options>(make(3e-2, 0.0)));
    return std::make_unique<Optimizer>(std::move(groups), make(1e-2, 0.0));
  };
}

struct Case {
  const char* name;
  Factory make;
};

std::vector<Case> cases() {
  using namespace torch::optim;
  return {
      {"SGD", two_groups<SGD, SGDOptions>([](double lr, double wd) { return SGDOptions(lr).momentum(0.9).weight_decay(wd); })},
      {"Adam", two_groups<Adam, AdamOptions>([](double lr, double wd) { return AdamOptions(lr).amsgrad(true).weight_decay(wd); })},
      {"AdamW", two_groups<AdamW, AdamWOptions>([](double lr, double wd) { return AdamWOptions(lr).weight_decay(wd); })},
      {"RMSprop", two_groups<RMSprop, RMSpropOptions>(
                      [](double lr, double wd) { return RMSpropOptions(lr).centered(true).momentum(0.5).weight_decay(wd); })},
      {"Adagrad", two_groups<Adagrad, AdagradOptions>([](double lr, double wd) { return AdagradOptions(lr).weight_decay(wd); })},
  };
}

std::string scratch(const std::string& what) {
  return "/tmp/tandem-optstate-" + what + "-" + std::to_string(getppid());
}

void remove_on_rank0(const std::string& dir) {
  test::pg().barrier();
  if (test::pg().rank() == 0) (void)!std::system(("rm -rf " + dir).c_str());
  test::pg().barrier();
}

// One loop: 5 steps of a 9-13-5 MLP (sizes no world size divides) on fixed data, then, when
// `load` is set, a new Accelerator of `load_stage` loads the checkpoint and reports what it holds.
struct Job {
  std::unique_ptr<Accelerator> acc;
  torch::nn::Sequential net;
  std::unique_ptr<torch::optim::Optimizer> opt;
};

Job make_job(const Case& c, int stage) {
  Job job;
  job.acc = std::make_unique<Accelerator>(test::shared_pg(),
                                          AcceleratorOptions().seed(3).progress(false).zero_stage(stage));
  torch::manual_seed(5);
  job.net = torch::nn::Sequential(torch::nn::Linear(9, 13), torch::nn::Tanh(), torch::nn::Linear(13, 5));
  Groups groups;
  std::vector<at::Tensor> weights, biases;
  for (const auto& item : job.net->named_parameters()) {
    (item.key().find("bias") != std::string::npos ? biases : weights).push_back(item.value());
  }
  groups.emplace_back(weights);
  groups.emplace_back(biases);
  job.opt = c.make(std::move(groups));
  return job;
}

void train(Job& job, int steps) {
  auto model = job.acc->prepare_model(job.net);
  job.acc->prepare_optimizer(*job.opt);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  auto loader = job.acc->prepare_data(at::randn({64, 9}, gen), at::randn({64, 5}, gen), 4);
  int b = 0;
  for (auto& batch : loader) {
    if (b++ == steps) break;
    job.acc->backward((model->forward(batch.data) - batch.target).pow(2).mean());
    job.acc->step(*job.opt);
    job.acc->zero_grad(*job.opt);
  }
}

std::string read_file(const std::string& f) {
  std::ifstream in(f, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every state tensor of `opt`, by parameter index in the groups' order and key, for comparison.
std::map<std::string, at::Tensor> state_of(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params) {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = opt.state().find(params[i].unsafeGetTensorImpl());
    if (it == opt.state().end()) continue;
    torch::serialize::OutputArchive archive;
    it->second->serialize(archive);
    std::ostringstream bytes;
    archive.save_to(bytes);
    out[std::to_string(i)] = at::from_blob(const_cast<char*>(bytes.str().data()),
                                           {static_cast<int64_t>(bytes.str().size())}, at::kByte).clone();
  }
  return out;
}

}  // namespace

// zero 1 -> 0 and 0 -> 1 at this world size, for every optimizer type: the loaded state is
// bit for bit the state an unsharded run reached (each parameter's serialized state compared
// byte for byte), and the consolidated files of the two checkpoints are the same bytes; zero 2
// loads it and saves it again unchanged.
TEST(OptimizerStateByName, ShardedAndWholeCheckpointsLoadIntoEachOther) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const std::string root_sharded = scratch(std::string(c.name) + "-z1"), root_whole = scratch(std::string(c.name) + "-z0");
    remove_on_rank0(root_sharded);
    remove_on_rank0(root_whole);
    Job sharded = make_job(c, 1), whole = make_job(c, 0);
    train(sharded, 5);
    train(whole, 5);
    const auto saved_sharded = sharded.acc->save_state(root_sharded);
    const auto saved_whole = whole.acc->save_state(root_whole);
    const auto params = whole.net->parameters();
    const auto reference = state_of(*whole.opt, params);
    ASSERT_EQ(reference.size(), params.size());
    // The two checkpoints hold the same optimizer state: the same consolidated bytes.
    if (test::pg().rank() == 0) {
      accelerate::consolidate_optimizer(saved_sharded, 0, root_sharded + "/consolidated.safetensors");
      accelerate::consolidate_optimizer(saved_whole, 0, root_whole + "/consolidated.safetensors");
      EXPECT_EQ(read_file(root_sharded + "/consolidated.safetensors"), read_file(root_whole + "/consolidated.safetensors"));
    }
    for (int stage : {0, 1}) {
      for (const auto& from : {saved_sharded, saved_whole}) {
        Job loaded = make_job(c, stage);
        train(loaded, 0);
        loaded.acc->load_state(from);
        const auto params_loaded = loaded.net->parameters();
        for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params_loaded[i], params[i])) << "weight " << i;
        const auto got = state_of(*loaded.opt, params_loaded);
        size_t held = 0;
        for (const auto& [index, bytes] : reference) {
          auto it = got.find(index);
          if (it == got.end()) continue;
          ++held;
          EXPECT_TRUE(at::equal(it->second, bytes)) << "stage " << stage << " from " << from << ": parameter " << index;
        }
        // Whole: every parameter's state; sharded: this rank's share, every parameter on some rank.
        if (stage == 0 || test::pg().size() == 1) {
          EXPECT_EQ(held, params.size());
          EXPECT_EQ(got.size(), params.size());
        } else {
          at::Tensor total = at::full({1}, static_cast<int64_t>(got.size()), at::kLong);
          test::pg().all_reduce(total);
          EXPECT_EQ(held, got.size());
          EXPECT_EQ(total.item<int64_t>(), static_cast<int64_t>(params.size()));
        }
        // Hyper-parameters: the groups' as saved.
        EXPECT_EQ(loaded.opt->param_groups()[1].options().get_lr(), whole.opt->param_groups()[1].options().get_lr());
      }
    }
    // Stage 2 holds flat slices, not parameters: loaded, then saved again, the state is the same
    // bytes (cut into this rank's slices and gathered back whole).
    {
      Job flat = make_job(c, 2);
      train(flat, 0);
      flat.acc->load_state(saved_whole);
      const std::string root_flat = scratch(std::string(c.name) + "-z2");
      remove_on_rank0(root_flat);
      const auto resaved = flat.acc->save_state(root_flat);
      if (test::pg().rank() == 0) {
        accelerate::consolidate_optimizer(resaved, 0, root_flat + "/consolidated.safetensors");
        EXPECT_EQ(read_file(root_flat + "/consolidated.safetensors"), read_file(root_whole + "/consolidated.safetensors"))
            << "stage 2: loaded then saved";
      }
      remove_on_rank0(root_flat);
    }
    remove_on_rank0(root_sharded);
    remove_on_rank0(root_whole);
  }
}

// A foreign optimizer file (another model's, the manifest rewritten to match it) and a damaged one
// (bytes changed under the manifest): one line naming the file; the weights stay as they were.
TEST(OptimizerStateByName, ForeignOrDamagedShardsAreRefusedWithNothingLoaded) {
  const auto c = cases()[2];  // AdamW
  const std::string root = scratch("bad"), other_root = scratch("other");
  remove_on_rank0(root);
  remove_on_rank0(other_root);
  Job job = make_job(c, 1);
  train(job, 3);
  const auto saved = job.acc->save_state(root);
  // Another model: other layer names ("0" and "2" become "first" and "second").
  {
    Accelerator other_acc(test::shared_pg(), AcceleratorOptions().progress(false).zero_stage(1));
    torch::nn::Sequential other;
    other->push_back("first", torch::nn::Linear(9, 13));
    other->push_back("second", torch::nn::Linear(13, 5));
    auto model = other_acc.prepare_model(other);
    torch::optim::AdamW opt(other->parameters(), torch::optim::AdamWOptions(1e-2));
    other_acc.prepare_optimizer(opt);
    other_acc.backward(model->forward(at::ones({2, 9})).sum());
    other_acc.step(opt);
    other_acc.save_state(other_root);
  }
  const std::string shard = test::pg().size() > 1 ? "optimizer_0.rank0.safetensors" : "optimizer_0.safetensors";
  const std::string victim = root + "/damaged", foreign = root + "/foreign";
  if (test::pg().rank() == 0) {
    // damaged: one byte of the shard changed, the manifest untouched
    (void)!std::system(("cp -r " + saved + " " + victim + " && printf 'X' | dd of=" + victim + "/" + shard +
                        " bs=1 seek=200 conv=notrunc status=none").c_str());
    // foreign: the other model's shard, with a manifest that matches it
    const auto other_saved = accelerate::list_checkpoints(other_root).back();
    (void)!std::system(("cp -r " + saved + " " + foreign + ".tmp && cp " + other_saved + "/" + shard + " " + foreign +
                        ".tmp/" + shard + " && rm " + foreign + ".tmp/manifest.json").c_str());
    accelerate::CheckpointWriter writer(root, "foreign");
    for (const auto& name : {std::string("state.json"), std::string("model_0.safetensors"), std::string("rng.safetensors"),
                             shard}) {
      (void)!std::system(("cp " + foreign + ".tmp/" + name + " " + writer.path_for(name)).c_str());
    }
    for (int r = 1; r < test::pg().size(); ++r) {
      const auto name = "optimizer_0.rank" + std::to_string(r) + ".safetensors";
      (void)!std::system(("cp " + foreign + ".tmp/" + name + " " + writer.path_for(name)).c_str());
    }
    writer.commit();
  }
  test::pg().barrier();
  Job fresh = make_job(c, 1);
  train(fresh, 0);
  std::vector<at::Tensor> before;
  for (const auto& p : fresh.net->parameters()) before.push_back(p.detach().clone());
  EXPECT_ERROR_HAS(fresh.acc->load_state(victim), shard + " has CRC-32");
  const std::string error = test::error_of([&] { fresh.acc->load_state(foreign); });
  EXPECT_THAT(error, ::testing::HasSubstr("/" + shard + " holds 'first."));
  EXPECT_THAT(error, ::testing::HasSubstr("which names no parameter of this optimizer"));
  EXPECT_EQ(error.find('\n'), std::string::npos);
  const auto after = fresh.net->parameters();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(after[i], before[i])) << "half-loaded: weight " << i;
  EXPECT_TRUE(fresh.opt->state().empty()) << "half-loaded: optimizer state";
  remove_on_rank0(root);
  remove_on_rank0(other_root);
}
