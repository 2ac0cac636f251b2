// budget_trainer --strategy ddp|fsdp [--checkpoints DIR]: a model that does not fit a per-process
// memory budget under DDP and trains under FSDP (tests/fsdp/memory_budget_test.sh puts each rank
// in a memory cgroup). Twelve Linear(2048, 2048) layers (50.4 M parameters, 201 MB in fp32) with
// Adam, through the Accelerator: DDP keeps weights, gradients (and its buckets) and Adam's two
// moments whole on every rank, about 1 GB; FSDP at 4 ranks keeps a quarter of each, plus a unit or
// two gathered at a time. Three steps, then a checkpoint (sharded under FSDP: Note [Sharded
// checkpoints], so saving stays within the budget too); each rank prints its accounted model
// state and its peak RSS.
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include "tandem/accelerate/accelerator.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/world.h"
#include "tandem/error.h"
#include "tandem/fsdp/auto_wrap.h"
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
  std::string strategy = "fsdp", checkpoints;
  app.add_option("--strategy", strategy)->check(CLI::IsMember({"ddp", "fsdp"}))->required();
  app.add_option("--checkpoints", checkpoints, "save a checkpoint here after training");
  CLI11_PARSE(app, argc, argv);
  auto pg = tandem::comm::ProcessGroup::create(tandem::comm::World::from_env());
  const bool fsdp = strategy == "fsdp";
  tandem::Accelerator acc(pg, tandem::AcceleratorOptions().progress(false).strategy(fsdp ? tandem::Strategy::Fsdp
                                                                                        : tandem::Strategy::Ddp));
  torch::manual_seed(0);
  auto net = make_model();
  if (fsdp) tandem::fsdp::wrap_entries(*net);  // each Linear a unit
  auto model = acc.prepare_model(net);
  torch::optim::Adam adam(net->parameters(), 1e-4);
  acc.prepare_optimizer(adam);  // FSDP: pointed at the shards
  at::Tensor x = torch::randn({4, kWidth}), y = torch::randn({4, kWidth});
  for (int step = 0; step < 3; ++step) {
    acc.zero_grad(adam);
    acc.backward((model->forward(x) - y).pow(2).mean());
    acc.step(adam);
  }
  double state_mb = tandem::zero::optimizer_state_bytes(adam) / 1e6;
  if (fsdp) {
    const auto m = model->fsdp()->memory();
    state_mb += (m.parameter_shards + m.gradient_shards) / 1e6;
  } else {
    for (const auto& p : net->parameters()) state_mb += 2.0 * p.nbytes() / 1e6;  // weights and gradients
  }
  if (!checkpoints.empty()) acc.save_state(checkpoints);
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
