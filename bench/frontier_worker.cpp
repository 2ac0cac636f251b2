// tandem-frontier-worker: one probe of `tandem bench --memory-budget` (Note [Memory frontier] in
// src/bench/frontier.cpp). Trains the GPT of bench/workloads.h at the given shape for a few steps
// with Adam under one strategy (tp and fsdp+tp: tensor parallelism by the plan of
// bench::gpt_tp_plan), through the Accelerator (what a user runs), and rank 0 appends one
// JSON record: parameters, tokens/s over the timed steps, the largest peak RSS of the ranks.
// bench/frontier_peer.py is its PyTorch twin (FSDP2 + checkpoint_wrapper), same flags, same record.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/optim/adam.h>

#include "bench/workloads.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/world.h"
#include "tandem/error.h"
#include "tandem/fsdp/auto_wrap_policy.h"
#include "tandem/fsdp/options.h"
#include "tandem/host_allocator.h"
#include "tandem/nn/checkpoint_policy.h"
#include "tandem/tp/loss_parallel.h"

namespace {

using namespace tandem;

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

int run(int argc, char** argv) {
  CLI::App app{"One probe of tandem bench --memory-budget"};
  std::string strategy, out;
  bench::GptConfig c;
  int64_t batch = 4;
  int steps = 3;
  app.add_option("--strategy", strategy)
      ->check(CLI::IsMember({"ddp", "ddp-checkpoint", "zero1", "zero2", "fsdp", "fsdp-checkpoint", "tp", "fsdp+tp"}))
      ->required();
  app.add_option("--vocab", c.vocab)->check(CLI::PositiveNumber)->required();
  app.add_option("--context", c.context)->check(CLI::PositiveNumber)->required();
  app.add_option("--dim", c.dim)->check(CLI::PositiveNumber)->required();
  app.add_option("--layers", c.layers)->check(CLI::PositiveNumber)->required();
  app.add_option("--heads", c.heads)->check(CLI::PositiveNumber)->required();
  app.add_option("--batch-size", batch, "sequences per process per step")->check(CLI::PositiveNumber)->required();
  app.add_option("--steps", steps, "training steps; the first is warm-up, the rest are timed")
      ->check(CLI::Range(2, 1000));
  app.add_option("--out", out, "append rank 0's JSON record here")->required();
  CLI11_PARSE(app, argc, argv);
  TANDEM_CHECK(c.dim % c.heads == 0, "--dim ", c.dim, " is not a multiple of --heads ", c.heads);

  // Every strategy gets the allocator setting that gives memory back (FSDP's own): under a budget
  // the strategies are compared at their smallest footprint, not at glibc's keep-freed cache.
  tune_host_allocator(HostAllocatorPolicy::ReturnLarge);
  auto pg = comm::ProcessGroup::create(comm::World::from_env());
  // tp: every process one tensor-parallel group (DDP over the rest: none); fsdp+tp: pairs, FSDP
  // across them. A TP group trains batch x its size sequences, so every strategy processes the
  // same tokens per process (tandem-bench-worker's rule).
  const int tp = strategy == "tp" ? pg->size() : strategy == "fsdp+tp" ? 2 : 1;
  TANDEM_CHECK(c.heads % tp == 0 && c.vocab % tp == 0 && pg->size() % tp == 0, strategy, " cuts ", c.heads,
               " heads and ", c.vocab, " classes over ", tp, " of ", pg->size(), " processes: they do not divide");
  const bool fsdp = strategy.rfind("fsdp", 0) == 0;
  auto options = AcceleratorOptions().progress(false).seed(0).strategy(fsdp ? Strategy::Fsdp : Strategy::Ddp);
  if (tp > 1) options.parallelism(ParallelismConfig().tp_size(tp));
  if (strategy == "zero1") options.zero_stage(1);
  if (strategy == "zero2") options.zero_stage(2);
  // The GPT's embedding and head are units already, and the Accelerator auto-wraps only a model
  // with none: ask for it, so that every block is a unit too (as tandem-bench-worker does).
  if (fsdp) options.fsdp(fsdp::FullyShardOptions().auto_wrap(fsdp::AutoWrapPolicy()));
  if (strategy == "fsdp-checkpoint" || strategy == "ddp-checkpoint") {
    options.activation_checkpointing(nn::CheckpointPolicy());  // every block
  }
  Accelerator acc(pg, options);
  bench::Gpt net(c);
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  auto model = tp > 1 ? acc.prepare_model(net, bench::gpt_tp_plan()) : acc.prepare_model(net);
  torch::optim::Adam adam(model->parameters(), 1e-4);
  acc.prepare_optimizer(adam);
  auto [x, y] = bench::synthetic_batch_gpt(c, batch * tp, 1000 + static_cast<uint64_t>(pg->rank() / tp));
  const auto tp_group = acc.tensor_parallel_group();
  auto loss_of = [&](const at::Tensor& logits) {
    return tp > 1 ? tp::cross_entropy(logits.to(at::kFloat), y, tp_group) : bench::loss_of(logits, y);
  };

  std::chrono::steady_clock::time_point start;
  for (int step = 0; step < steps; ++step) {
    if (step == 1) start = std::chrono::steady_clock::now();  // step 0 is warm-up
    acc.zero_grad(adam);
    acc.backward(loss_of(model->forward(x)));
    acc.step(adam);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  at::Tensor peak = at::tensor({static_cast<double>(peak_rss_bytes())}, at::kDouble);
  pg->all_reduce(peak, comm::ReduceOp::Max);
  if (pg->rank() == 0) {
    nlohmann::json record{{"impl", "tandem"},
                          {"strategy", strategy},
                          {"params", params},
                          {"world", pg->size()},
                          {"tokens_per_s", static_cast<double>((steps - 1) * batch * c.context * pg->size()) / seconds},
                          {"step_s", seconds / (steps - 1)},
                          {"peak_rss_bytes", static_cast<int64_t>(peak.item<double>())}};
    std::ofstream(out, std::ios::app) << record.dump() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-frontier-worker: %s\n", tandem::one_line(e).c_str());
    return 1;
  }
}
