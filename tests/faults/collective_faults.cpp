// Collective faults, each a scenario run as every rank of a `tandem run` job by
// tests/faults/collective_fault.sh, which checks the exit status, the message and the time taken.
//   hang-rank-1        rank 1 stops calling collectives after three all-reduces
//   hang-rank-1-cuda   the same with CUDA tensors, on NCCL (scripts/gpu-check; exit 77 without GPU)
//   hang-in-ddp        rank 1 stops before its third DDP backward
//   hang-in-fsdp       rank 1 stops before its third FSDP forward (rank 0 waits in a unit's all-gather)
//   exit-rank-1        rank 1 returns (its data ran out) while rank 0 trains on
//   mismatch-shape     TANDEM_DEBUG=DETAIL: the ranks all-reduce tensors of different shapes
//   mismatch-op        TANDEM_DEBUG=DETAIL: rank 0 all-reduces while rank 1 broadcasts
// Each rank prints "detected after N ms" once its collective failed: the time from entering the
// collective that never completed to the error.
#include <chrono>
#include <cstdio>
#include <thread>

#include <ATen/ATen.h>
#include <torch/nn.h>
#include <torch/optim/sgd.h>

#include <signal.h>
#include <unistd.h>

#include "support/distributed_main.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/error.h"
#include "tandem/fsdp/auto_wrap.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"

namespace {

using tandem::test::pg;
using Clock = std::chrono::steady_clock;

[[noreturn]] void stop_forever() {
  std::fprintf(stderr, "rank %d: no longer calling collectives (test injection)\n", pg().rank());
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// Runs `body`, which must fail; prints the time it took and the error, returns 1.
template <typename Body>
int must_fail(Body body) {
  const auto start = Clock::now();
  try {
    body();
  } catch (const std::exception& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    std::fprintf(stderr, "rank %d: %s\nrank %d: detected after %lld ms\n", pg().rank(), tandem::one_line(e).c_str(),
                 pg().rank(), static_cast<long long>(ms));
    return 1;
  }
  std::fprintf(stderr, "rank %d: the collective unexpectedly succeeded\n", pg().rank());
  return 2;
}

int warm_up() {
  for (int i = 0; i < 3; ++i) {
    auto t = at::ones({4});
    pg().all_reduce(t);
  }
  return 0;
}

int hang_rank_1() {
  warm_up();
  if (pg().rank() == 1) stop_forever();
  return must_fail([] {
    auto t = at::ones({4});
    pg().all_reduce(t);
  });
}

// NCCL's wait() only orders streams unless TORCH_NCCL_BLOCKING_WAIT=1; scripts/gpu-check sets it
// so that the failure reaches this thread and names the missing rank like Gloo's.
int hang_rank_1_cuda() {
  if (!pg().has_nccl()) {
    std::fprintf(stderr, "no NCCL backend here (no GPU visible): skipped\n");
    return 77;
  }
  const auto device = pg().world().device(/*use_cuda=*/true);
  for (int i = 0; i < 3; ++i) {
    auto t = at::ones({4}, at::TensorOptions().device(device));
    pg().all_reduce(t);
  }
  if (pg().rank() == 1) stop_forever();
  return must_fail([&] {
    auto t = at::ones({4}, at::TensorOptions().device(device));
    pg().all_reduce(t);
    (void)t.sum().item<float>();  // waits for the stream: the failure surfaces here at the latest
  });
}

int exit_rank_1() {
  warm_up();
  if (pg().rank() == 1) {
    std::fprintf(stderr, "rank 1: out of data, returning (test injection)\n");
    return 0;
  }
  return must_fail([] {
    for (int i = 0; i < 100; ++i) {
      auto t = at::ones({4});
      pg().all_reduce(t);
    }
  });
}

// Two synced steps, then rank 1 stops; the others' third step must fail naming it.
template <typename Model>
int train_until_rank_1_stops(Model& model, torch::optim::Optimizer& opt) {
  for (int step = 0; step < 5; ++step) {
    if (step == 2 && pg().rank() == 1) stop_forever();
    auto x = torch::randn({4, 8});
    opt.zero_grad();
    if (step < 2) {
      model->forward(x).sum().backward();
    } else {
      return must_fail([&] { model->forward(x).sum().backward(); });
    }
    opt.step();
  }
  return 2;
}

torch::nn::Sequential small_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 1));
}

int hang_in_ddp() {
  auto model = tandem::ddp::DistributedDataParallel(small_net(), tandem::test::shared_pg(),
                                                    tandem::ddp::DistributedDataParallelOptions().bucket_cap_mb(0.0005));
  torch::optim::SGD sgd(model->parameters(), 0.1);
  return train_until_rank_1_stops(model, sgd);
}

int hang_in_fsdp() {
  auto net = small_net();
  tandem::fsdp::wrap_entries(*net);
  tandem::fsdp::FullyShardedDataParallel model(net, tandem::test::shared_pg());
  torch::optim::SGD sgd(model->shard_parameters(), 0.1);
  return train_until_rank_1_stops(model, sgd);
}

int mismatch_shape() {
  warm_up();
  return must_fail([] {
    auto t = at::ones({pg().rank() == 0 ? 4 : 5});
    pg().all_reduce(t);
  });
}

int mismatch_op() {
  warm_up();
  return must_fail([] {
    auto t = at::ones({2, 2});
    if (pg().rank() == 0) {
      pg().all_reduce(t);
    } else {
      pg().broadcast(t, 0);
    }
  });
}

// Rank 1 skips collective #4: its #4 is the others' #5 (a broadcast), so the ranks disagree there.
int skip_collective() {
  warm_up();
  return must_fail([] {
    auto t = at::ones({4});
    if (pg().rank() != 1) pg().all_reduce(t);
    pg().broadcast(t, 0);
  });
}

// Rank 0 sends the message meant for rank 1 to rank 2; rank 1 waits for it, rank 2 never asks.
int p2p_wrong_peer() {
  warm_up();
  return must_fail([] {
    at::Tensor t = at::ones({6});
    if (pg().rank() == 0) pg().send(t, 2);
    if (pg().rank() == 1) pg().recv(t, 0);
    pg().barrier();
  });
}

// Rank 1 is killed after two of the five messages rank 0 waits for.
int p2p_killed_mid() {
  warm_up();
  return must_fail([] {
    at::Tensor t = at::ones({6});
    for (int i = 0; i < 5; ++i) {
      if (pg().rank() == 1 && i == 2) ::kill(::getpid(), SIGKILL);
      if (pg().rank() == 1) pg().send(t, 0);
      if (pg().rank() == 0) pg().recv(t, 1);
    }
    pg().barrier();
  });
}

}  // namespace

int main(int argc, char** argv) {
  return tandem::test::distributed_test_main(argc, argv,
                                             {{"hang-rank-1", hang_rank_1},
                                              {"hang-rank-1-cuda", hang_rank_1_cuda},
                                              {"exit-rank-1", exit_rank_1},
                                              {"hang-in-ddp", hang_in_ddp},
                                              {"hang-in-fsdp", hang_in_fsdp},
                                              {"mismatch-shape", mismatch_shape},
                                              {"mismatch-op", mismatch_op},
                                              {"skip-collective", skip_collective},
                                              {"p2p-wrong-peer", p2p_wrong_peer},
                                              {"p2p-killed-mid", p2p_killed_mid}});
}
