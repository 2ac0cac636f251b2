// budget_trainer --strategy ddp|fsdp: a model that does not fit a per-process memory budget under
// DDP and trains under FSDP (tests/fsdp/memory_budget_test.sh puts each rank in a memory cgroup).
// Twelve Linear(2048, 2048) layers (50.4 M parameters, 201 MB in fp32) with Adam: DDP keeps
// weights, gradients (and its buckets) and Adam's two moments whole on every rank, about 1 GB;
// FSDP at 4 ranks keeps a quarter of each, plus a unit or two gathered at a time. Three steps;
// each rank prints its accounted model state and its peak RSS.
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include "tandem/comm/process_group.h"
#include "tandem/comm/world.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/error.h"
#include "tandem/fsdp/auto_wrap.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/zero/state_bytes.h"

namespace {

constexpr int64_t kWidth = 2048, kLayers = 12;

torch::nn::Sequential make_model() {
  torch::nn::Sequential net;
  for (int64_t i = 0; i < kLayers; ++i) {
    net->push_back(torch::nn::Linear(kWidth, kWidth));
    net->push_back(torch::nn::Tanh());
  }
  return net;
}

double peak_rss_mb() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;
}

int run(int argc, char** argv) {
  CLI::App app{"A model over a per-process memory budget: DDP against FSDP"};
  std::string strategy = "fsdp";
  app.add_option("--strategy", strategy)->check(CLI::IsMember({"ddp", "fsdp"}))->required();
  CLI11_PARSE(app, argc, argv);
  auto pg = tandem::comm::ProcessGroup::create(tandem::comm::World::from_env());
  torch::manual_seed(0);
  auto net = make_model();
  at::Tensor x = torch::randn({4, kWidth}), y = torch::randn({4, kWidth});
  auto train = [&](auto& model, torch::optim::Optimizer& adam) {
    for (int step = 0; step < 3; ++step) {
      adam.zero_grad();
      (model->forward(x) - y).pow(2).mean().backward();
      adam.step();
    }
  };
  double state_mb = 0;
  if (strategy == "ddp") {
    tandem::ddp::DistributedDataParallel model(net, pg);
    torch::optim::Adam adam(model->parameters(), 1e-4);
    train(model, adam);
    for (const auto& p : net->parameters()) state_mb += 2.0 * p.nbytes() / 1e6;  // weights and gradients
    state_mb += tandem::zero::optimizer_state_bytes(adam) / 1e6;
  } else {
    tandem::fsdp::wrap_entries(*net);
    tandem::fsdp::FullyShardedDataParallel model(net, pg);
    torch::optim::Adam adam(model->shard_parameters(), 1e-4);
    train(model, adam);
    const auto m = model->memory();
    state_mb = (m.parameter_shards + m.gradient_shards + tandem::zero::optimizer_state_bytes(adam)) / 1e6;
  }
  std::printf("rank %d: %s trained 3 steps; model state %.0f MB accounted, peak RSS %.0f MB\n", pg->rank(),
              strategy.c_str(), state_mb, peak_rss_mb());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "budget_trainer: %s\n", tandem::one_line(e).c_str());
    return 1;
  }
}
