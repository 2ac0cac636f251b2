// Tandem's half of the FSDP2 mixed-precision comparison (tests/fsdp/fsdp2_mixed_precision.py):
// the MLP 13-11-7-3 (layer sizes no world size divides), each Linear a unit, bfloat16 compute,
// AdamW in two groups, 20 steps of the batches both sides draw from the same seeds.
//   mixed_precision_run INIT OUT REDUCE      REDUCE: bf16 | fp32
// Rank 0 writes the initial weights to INIT (the Python side starts from them) and the trained
// weights, gathered, to OUT.
#include <cstdio>
#include <string>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "tandem/accelerate/safetensors.h"
#include "tandem/comm/process_group.h"
#include "tandem/error.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"

int main(int argc, char** argv) try {
  TANDEM_CHECK(argc == 4, "usage: mixed_precision_run INIT OUT bf16|fp32");
  const std::string reduce = argv[3];
  TANDEM_CHECK(reduce == "bf16" || reduce == "fp32", "mixed_precision_run: REDUCE is bf16 or fp32, got '", reduce, "'");
  auto pg = tandem::comm::ProcessGroup::create(tandem::comm::World::from_env());
  torch::manual_seed(7);
  auto net = torch::nn::Sequential(torch::nn::Linear(13, 11), torch::nn::Tanh(), torch::nn::Linear(11, 7),
                                   torch::nn::Tanh(), torch::nn::Linear(7, 3));
  if (pg->rank() == 0) {
    std::vector<std::pair<std::string, at::Tensor>> init;
    for (const auto& item : net->named_parameters()) init.emplace_back(item.key(), item.value());
    tandem::accelerate::save_safetensors(argv[1], init);
  }
  // Weights (decay) and biases (none), as the Python side groups them.
  std::vector<at::Tensor> weights, biases;
  for (const auto& p : net->parameters()) (p.dim() > 1 ? weights : biases).push_back(p);
  torch::optim::AdamW optimizer({torch::optim::OptimizerParamGroup(weights, std::make_unique<torch::optim::AdamWOptions>(
                                                                             torch::optim::AdamWOptions(1e-2).weight_decay(0.1))),
                                 torch::optim::OptimizerParamGroup(biases, std::make_unique<torch::optim::AdamWOptions>(
                                                                            torch::optim::AdamWOptions(3e-2).weight_decay(0)))});
  tandem::fsdp::wrap_entries(*net);
  const auto policy = tandem::fsdp::MixedPrecisionPolicy()
                          .param_dtype(at::kBFloat16)
                          .reduce_dtype(reduce == "bf16" ? at::kBFloat16 : at::kFloat);
  tandem::fsdp::FullyShardedDataParallel model(net, pg, tandem::fsdp::FullyShardOptions().mixed_precision(policy));
  tandem::fsdp::shard_optimizer(optimizer, model->engine());
  for (int step = 0; step < 20; ++step) {
    torch::manual_seed(1000 * step + 10 * pg->rank());
    const at::Tensor x = torch::randn({8, 13});
    const at::Tensor y = torch::randn({8, 3});
    (model->forward(x) - y).pow(2).mean().backward();
    optimizer.step();
    optimizer.zero_grad();
  }
  const auto trained = model->gather_parameters();
  if (pg->rank() == 0) tandem::accelerate::save_safetensors(argv[2], trained);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
