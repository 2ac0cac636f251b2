// Checkpoints at another world size: the phases tests/accelerate/reshard_test.sh runs as jobs of
// different sizes (accelerator_test --scenario=reshard):
//   RESHARD_PHASE=save  K batches of epoch 0, then save_state(RESHARD_TO)
//   RESHARD_PHASE=load  load_state(RESHARD_FROM), save_state(RESHARD_TO) at once (the round trip
//                       the script compares byte for byte), then the rest of epoch 0 and epoch 1
// with zero_stage RESHARD_ZERO (3: Strategy::Fsdp, each Linear a unit; 4: HSDP, FSDP within pairs
// of processes). Each rank writes the samples it read, "<epoch> <id>" per line, and
// a last line "loss <value>" to RESHARD_OUT.rank<r>.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "support/distributed_main.h"
#include "accelerate/two_group_adamw.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/error.h"

namespace tandem::test {

int reshard_scenario() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    TANDEM_CHECK(v, "reshard scenario: set ", name);
    return std::string(v);
  };
  const std::string phase = env("RESHARD_PHASE"), out = env("RESHARD_OUT");
  const int zero = std::stoi(env("RESHARD_ZERO"));
  // 3: FSDP; 4: HSDP, FSDP within pairs of processes and replicated across them.
  auto options = AcceleratorOptions().seed(3).progress(false);
  if (zero >= 3) options.strategy(Strategy::Fsdp);
  if (zero == 4) options.parallelism(tandem::ParallelismConfig().shard_size(2));
  if (zero < 3) options.zero_stage(zero);
  Accelerator acc(shared_pg(), options);
  torch::manual_seed(5);
  auto net = zero_net();
  auto model = acc.prepare_model(net);
  torch::optim::AdamW opt(test::two_group_adamw(*net), torch::optim::AdamWOptions(1e-2));
  acc.prepare_optimizer(opt);
  // 100 samples whatever the world size; the targets carry each sample's id.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  at::Tensor x = at::randn({100, 9}, gen), y = at::randn({100, 5}, gen);
  auto loader = acc.prepare_data(x, at::cat({y, at::arange(100, at::kFloat).unsqueeze(1)}, 1), 4);
  std::ofstream log(out + ".rank" + std::to_string(acc.process_index()));
  auto train = [&](int limit) {  // until `limit` batches (or the end of the epoch)
    int b = 0;
    double loss_value = 0;
    const int64_t epoch = loader.epoch();
    for (auto& batch : loader) {
      at::Tensor ids = batch.target.select(1, 5);
      for (int64_t i = 0; i < ids.numel(); ++i) log << epoch << " " << static_cast<int64_t>(ids[i].item<float>()) << "\n";
      at::Tensor loss = (model->forward(batch.data) - batch.target.narrow(1, 0, 5)).pow(2).mean();
      acc.backward(loss);
      acc.step(opt);
      acc.zero_grad(opt);
      loss_value = loss.item<double>();
      if (++b == limit) break;
    }
    return loss_value;
  };
  double loss = 0;
  if (phase == "save") {
    loss = train(std::stoi(env("RESHARD_K")));
    acc.save_state(env("RESHARD_TO"));
  } else {
    TANDEM_CHECK(phase == "load", "reshard scenario: RESHARD_PHASE is save or load, not ", phase);
    acc.load_state(env("RESHARD_FROM"));
    acc.save_state(env("RESHARD_TO"));
    train(-1);         // the rest of epoch 0
    loss = train(-1);  // epoch 1
  }
  log << "loss " << loss << "\n";
  TANDEM_CHECK(std::isfinite(loss), "reshard scenario: the loss is ", loss);
  return 0;
}

}  // namespace tandem::test
