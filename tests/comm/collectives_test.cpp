// Collectives on real c10d engines, checked exactly. The same binary runs as a world of one
// (plain ctest) or as every rank of a job under `tandem run` (2 and 4 ranks, and across two
// network namespaces): each rank runs the same tests in the same order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "support/distributed_main.h"
#include "tandem/comm/cuda_info.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/shard_layout.h"
#include "tandem/error.h"

using tandem::comm::ProcessGroup;
using tandem::comm::ReduceOp;

namespace {

using tandem::test::pg;
int W() { return pg().size(); }
int R() { return pg().rank(); }

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kInt, at::kLong, at::kHalf, at::kBFloat16};
const std::vector<int64_t> kSizes = {0, 1, 7, 1000, 1 << 18};

// Small integers: exact in every dtype above, and their sums over 4 ranks too (bf16 holds
// integers exactly only up to 256, half up to 2048).
at::Tensor pattern(int64_t n, at::ScalarType dtype) {
  return at::arange(n, at::kLong).remainder(dtype == at::kBFloat16 ? 16 : 100).to(dtype);
}

std::string label(at::ScalarType dtype, int64_t n) {
  return std::string(c10::toString(dtype)) + "[" + std::to_string(n) + "] on " + std::to_string(W()) + " ranks";
}

}  // namespace

TEST(Collectives, AllReduceSumIsExact) {
  for (auto dtype : kDtypes) {
    for (auto n : kSizes) {
      at::Tensor t = pattern(n, dtype) * (R() + 1);
      pg().all_reduce(t, ReduceOp::Sum);
      at::Tensor expected = pattern(n, dtype) * (W() * (W() + 1) / 2);
      EXPECT_TRUE(at::equal(t, expected)) << label(dtype, n);
    }
  }
}

TEST(Collectives, AllReduceMaxAndMinAreExact) {
  for (auto dtype : kDtypes) {
    for (auto n : kSizes) {
      at::Tensor mx = pattern(n, dtype) + R();
      at::Tensor mn = pattern(n, dtype) + R();
      pg().all_reduce(mx, ReduceOp::Max);
      pg().all_reduce(mn, ReduceOp::Min);
      EXPECT_TRUE(at::equal(mx, pattern(n, dtype) + (W() - 1))) << label(dtype, n);
      EXPECT_TRUE(at::equal(mn, pattern(n, dtype))) << label(dtype, n);
    }
  }
}

TEST(Collectives, AllReduceAvgIsSumOverWorldSize) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (auto n : kSizes) {
      at::Tensor t = pattern(n, dtype) * (R() + 1);
      pg().all_reduce(t, ReduceOp::Avg);
      // (1 + ... + W) / W = (W + 1) / 2: exact for small integers times halves.
      at::Tensor expected = pattern(n, dtype) * ((W() + 1) / 2.0);
      EXPECT_TRUE(at::equal(t, expected)) << label(dtype, n);
    }
  }
}

// Half and BFloat16 sums (DDP's compression hooks) round after every addition, whatever the
// backend's order: each element must be within (W - 1) roundings of the exact sum of the inputs,
// |result - exact| <= (W - 1) * u * sum |x_r| with u the unit roundoff, and the same on every rank.
TEST(Collectives, AllReduceOfHalfPrecisionIsWithinRoundingOfTheExactSum) {
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    const double u = dtype == at::kHalf ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < W(); ++r) {
      at::manual_seed(1000 + r);
      inputs.push_back(at::randn({100000}).to(dtype));
    }
    at::Tensor t = inputs[static_cast<size_t>(R())].clone();
    pg().all_reduce(t, ReduceOp::Sum);
    at::Tensor exact = at::zeros({100000}, at::kDouble), magnitude = at::zeros({100000}, at::kDouble);
    for (const auto& x : inputs) {
      exact += x.to(at::kDouble);
      magnitude += x.to(at::kDouble).abs();
    }
    at::Tensor excess = (t.to(at::kDouble) - exact).abs() - magnitude * ((W() - 1) * u) - exact.abs() * u;
    EXPECT_LE(excess.max().item<double>(), 0.0) << c10::toString(dtype) << " on " << W() << " ranks";
    auto all = pg().all_gather(t);
    for (int r = 0; r < W(); ++r) EXPECT_TRUE(at::equal(all[static_cast<size_t>(r)], t)) << "rank " << r << " differs";
  }
}

// DDP keeps several buckets in flight and waits for them in its own order: every one must
// complete, whatever the order of the waits (the MPI backend runs them on one thread, in order).
TEST(Collectives, AsyncAllReducesCompleteInAnyWaitOrder) {
  std::vector<at::Tensor> buckets;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int64_t b = 0; b < 6; ++b) {
    buckets.push_back(pattern(1000 * (b + 1), at::kFloat) * (R() + 1));
    works.push_back(pg().all_reduce_async(buckets.back(), ReduceOp::Sum));
  }
  for (int64_t b = 5; b >= 0; --b) {
    pg().wait(works[static_cast<size_t>(b)], "bucket " + std::to_string(b));
    EXPECT_TRUE(at::equal(buckets[static_cast<size_t>(b)], pattern(1000 * (b + 1), at::kFloat) * (W() * (W() + 1) / 2)))
        << "bucket " << b;
  }
}

// The ctest entry says which CPU backend it means to test; the group must have picked it
// (auto under mpirun is MPI, under `tandem run` Gloo).
TEST(Collectives, CpuBackendIsTheExpectedOne) {
  const char* expected = std::getenv("TANDEM_TEST_EXPECT_CPU_BACKEND");
  if (!expected) GTEST_SKIP() << "TANDEM_TEST_EXPECT_CPU_BACKEND not set";
  EXPECT_STREQ(tandem::comm::to_string(pg().cpu_backend()), expected);
}

TEST(Collectives, AllReduceOf100MB) {
  const int64_t n = 100LL * 1024 * 1024 / 4;
  at::Tensor t = at::full({n}, static_cast<float>(R() + 1), at::kFloat);
  pg().all_reduce(t, ReduceOp::Sum);
  EXPECT_TRUE(at::equal(t, at::full({n}, static_cast<float>(W() * (W() + 1) / 2), at::kFloat)));
}

TEST(Collectives, BroadcastFromEveryRoot) {
  for (auto dtype : kDtypes) {
    for (auto n : kSizes) {
      for (int root = 0; root < W(); ++root) {
        at::Tensor t = pattern(n, dtype) + R();
        pg().broadcast(t, root);
        EXPECT_TRUE(at::equal(t, pattern(n, dtype) + root)) << label(dtype, n) << " root " << root;
      }
    }
  }
}

TEST(Collectives, BroadcastCoalescedMixesDtypes) {
  std::vector<at::Tensor> ts = {at::full({3, 2}, R(), at::kFloat), at::full({5}, R(), at::kLong),
                                at::full({0}, R(), at::kFloat), at::full({2, 2, 2}, R(), at::kDouble),
                                at::full({4}, R(), at::kFloat)};
  pg().broadcast_coalesced(ts, W() - 1);
  for (const auto& t : ts) EXPECT_TRUE(at::equal(t, at::full_like(t, W() - 1)));
  EXPECT_EQ(ts[0].sizes(), (std::vector<int64_t>{3, 2}));
}

TEST(Collectives, AllGatherOrdersByRank) {
  for (auto dtype : kDtypes) {
    for (auto n : kSizes) {
      at::Tensor mine = pattern(n, dtype) + R();
      auto all = pg().all_gather(mine);
      ASSERT_EQ(static_cast<int>(all.size()), W());
      for (int r = 0; r < W(); ++r) EXPECT_TRUE(at::equal(all[r], pattern(n, dtype) + r)) << label(dtype, n);
    }
  }
}

// Flat collectives (Note [Flat collectives]) over sizes that do not divide the world: each rank
// pads to ShardLayout, contributes (r + 1) x the pattern, and must own exactly the summed slice
// [begin(r), end(r)) of the unpadded sum; the all-gather then puts every rank's slice back in order.
TEST(Collectives, ReduceScatterAndAllGatherIntoFlatShardsOfAnySize) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{(1 << 18) + 3}}) {
      const tandem::comm::ShardLayout layout{n, W()};
      at::Tensor input = at::zeros({layout.padded()}, dtype);
      input.narrow(0, 0, n).copy_(pattern(n, dtype) * (R() + 1));
      at::Tensor mine = at::full({layout.shard()}, -1, dtype);
      pg().reduce_scatter(mine, input, ReduceOp::Sum);
      const at::Tensor sum = pattern(n, dtype) * (W() * (W() + 1) / 2);
      const int64_t owned = layout.owned(R());
      EXPECT_TRUE(at::equal(mine.narrow(0, 0, owned), sum.narrow(0, layout.begin(R()), owned))) << label(dtype, n);
      EXPECT_TRUE(at::equal(mine.narrow(0, owned, layout.shard() - owned),
                            at::zeros({layout.shard() - owned}, dtype)))
          << "padding sums to zero: " << label(dtype, n);
      at::Tensor whole = at::full({layout.padded()}, -1, dtype);
      pg().all_gather_into(whole, mine);
      EXPECT_TRUE(at::equal(whole.narrow(0, 0, n), sum)) << label(dtype, n);
    }
  }
}

TEST(Collectives, ReduceScatterAvgAndAsyncWork) {
  const tandem::comm::ShardLayout layout{10, W()};
  at::Tensor input = at::zeros({layout.padded()});
  input.narrow(0, 0, 10).copy_(at::arange(10, at::kFloat) * (R() + 1));
  at::Tensor mine = at::empty({layout.shard()});
  pg().reduce_scatter(mine, input, ReduceOp::Avg);
  const at::Tensor avg = at::arange(10, at::kFloat) * ((W() + 1) / 2.0);
  EXPECT_TRUE(at::allclose(mine.narrow(0, 0, layout.owned(R())), avg.narrow(0, layout.begin(R()), layout.owned(R()))));
  // Two in flight, waited in reverse order.
  at::Tensor a = at::ones({4 * W()}), b = at::full({2 * W()}, 2.0);
  at::Tensor out_a = at::empty({4}), out_b = at::empty({2});
  auto work_a = pg().reduce_scatter_async(out_a, a);
  auto work_b = pg().reduce_scatter_async(out_b, b);
  pg().wait(work_b, "reduce_scatter b");
  pg().wait(work_a, "reduce_scatter a");
  EXPECT_TRUE(at::equal(out_a, at::full({4}, double(W()))));
  EXPECT_TRUE(at::equal(out_b, at::full({2}, 2.0 * W())));
  try {
    pg().reduce_scatter_async(out_a, a, ReduceOp::Avg);
    FAIL() << "async avg accepted on CPU";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("pre-divide and use Sum"), std::string::npos) << e.what();
  }
}

TEST(Collectives, FlatCollectivesRefuseMismatchedBuffers) {
  at::Tensor input = at::ones({3 * W() + 1}), out = at::empty({3});
  try {
    pg().reduce_scatter(out, input);
    FAIL() << "a whole buffer that is not size() shards accepted";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter: the whole buffer has"), std::string::npos) << e.what();
  }
  at::Tensor doubles = at::empty({W()}, at::kDouble), one = at::ones({1});
  EXPECT_THROW(pg().all_gather_into(doubles, one), tandem::Error);
}

TEST(Collectives, BarrierWaitsForEveryRank) {
  // Ranks arrive staggered; nobody may leave the barrier before the last one has arrived.
  std::this_thread::sleep_for(std::chrono::milliseconds(50 * R()));
  pg().store()->add("barrier_test/arrived", 1);
  pg().barrier();
  EXPECT_EQ(pg().store()->add("barrier_test/arrived", 0), W());
  pg().barrier();
}

TEST(Collectives, BadInputsAreClearErrors) {
  at::Tensor ints = at::ones({4}, at::kInt);
  try {
    pg().all_reduce(ints, ReduceOp::Avg);
    FAIL() << "integer avg accepted";
  } catch (const tandem::Error& e) {
    EXPECT_STREQ(e.what(), "all_reduce avg needs a floating-point tensor, got Int");
  }
  at::Tensor strided = at::ones({4, 4}).t();
  EXPECT_THROW(pg().all_reduce(strided), tandem::Error);
  at::Tensor t = at::ones({2});
  EXPECT_THROW(pg().broadcast(t, W()), tandem::Error);
  if (!pg().has_nccl()) {
    try {
      (void)pg().backend_for(c10::Device("cuda:0"));
      FAIL() << "CUDA device accepted without NCCL";
    } catch (const tandem::Error& e) {
      EXPECT_EQ(std::string(e.what()), "a CUDA tensor needs the NCCL backend, which rank " + std::to_string(R()) +
                                           " does not have: " + pg().nccl_unavailable());
      EXPECT_NE(pg().nccl_unavailable(), "");
    }
  } else {
    const int other = pg().cuda_device()->index() == 0 ? 1 : 0;  // another rank's device
    try {
      (void)pg().backend_for(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(other)));
      FAIL() << "a device other than the bound one accepted";
    } catch (const tandem::Error& e) {
      EXPECT_NE(std::string(e.what()).find("each rank's CUDA tensors must be on its own device"), std::string::npos) << e.what();
    }
  }
}

// NCCL on each rank's own device (Note [Device binding]): a world of one on one GPU, or one rank
// per GPU. Skips visibly, on every rank together, where any rank has no NCCL backend.
TEST(Nccl, AllReduceOnCudaTensor) {
  if (!tandem::test::every_rank_has_nccl()) GTEST_SKIP() << tandem::test::why_no_nccl();
  const c10::Device device = *pg().cuda_device();
  EXPECT_EQ(device.index(), pg().world().local_rank);
  EXPECT_EQ(c10::impl::VirtualGuardImpl(c10::kCUDA).getDevice(), device) << "create() makes it the current device";
  auto opts = at::TensorOptions().device(device);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    at::Tensor t = pattern(1 << 20, dtype).to(opts) * (R() + 1);
    pg().all_reduce(t, ReduceOp::Sum);
    EXPECT_TRUE(at::equal(t.cpu(), pattern(1 << 20, dtype) * (W() * (W() + 1) / 2)));
  }
  at::Tensor f = pattern(1000, at::kFloat).to(opts) * (R() + 1);
  pg().all_reduce(f, ReduceOp::Avg);
  EXPECT_TRUE(at::equal(f.cpu(), pattern(1000, at::kFloat) * ((W() + 1) / 2.0)));
  // Stream order, not a host wait: a kernel queued right after the call sees the reduced values.
  at::Tensor g = at::ones({1 << 22}, opts);
  pg().all_reduce(g, ReduceOp::Sum);
  EXPECT_EQ(g.sum().item<double>(), double(W()) * (1 << 22));
}

// The flight recorder on NCCL (Note [Device completion] in src/comm/flight_recorder.cpp): a
// collective on CUDA tensors is recorded with its op, size and dtype, and is "done" in a dump
// once the device ran it (here: after a copy to the host waited for it). The dump is asked for as
// `tandem run` asks, with SIGUSR1.
TEST(Nccl, FlightRecorderRecordsCudaCollectivesDoneOnTheDevice) {
  if (!tandem::test::every_rank_has_nccl()) GTEST_SKIP() << tandem::test::why_no_nccl();
  std::string folder = ::testing::TempDir() + "flight-nccl-XXXXXX";
  ASSERT_NE(::mkdtemp(folder.data()), nullptr);
  ::setenv("TANDEM_FLIGHT_RECORDER_DIR", folder.c_str(), 1);
  const c10::Device device = *pg().cuda_device();
  at::Tensor t = at::ones({12345}, at::TensorOptions().device(device));
  pg().all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(t.sum().item<double>(), 12345.0 * W());  // the host waited for the device
  const std::string path = folder + "/flight_rank_" + std::to_string(R()) + ".txt";
  ::raise(SIGUSR1);
  std::string text;
  for (int i = 0; i < 100 && text.find("12345") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ::unsetenv("TANDEM_FLIGHT_RECORDER_DIR");
  bool found = false;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("op\tC\t", 0) != 0 || line.find("\t12345\tFloat\t") == std::string::npos) continue;
    found = true;
    EXPECT_NE(line.find("\tdone\t"), std::string::npos) << line;
  }
  EXPECT_TRUE(found) << "no all-reduce of 12345 floats in " << path << ":\n" << text;
}

// Run alone (its own ctest entry): rank 0 skips a collective that rank 1 enters, so rank 1 must
// fail within the collective timeout with the operation named, instead of hanging.
TEST(Timeout, AMissingPeerEndsTheCollectiveWithItsName) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  if (R() == 0) {
    std::this_thread::sleep_for(pg().options().timeout() + std::chrono::seconds(2));
    return;
  }
  at::Tensor t = at::ones({4});
  try {
    pg().all_reduce(t);
    FAIL() << "all_reduce completed without rank 0";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce of 4 Float on cpu (sum) failed on rank 1 of 2"),
              std::string::npos) << e.what();
    // The timeout ended it, not rank 0 going away (which happens only after the timeout + 2 s).
    // Gloo says "Timed out waiting ..." for a recv and "timed out" elsewhere: compare lowercased.
    std::string lower = e.what();
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    EXPECT_NE(lower.find("timed out"), std::string::npos) << e.what();
  }
}

int main(int argc, char** argv) {
  tandem::test::Injections inject;
  // Failure injection for the launcher tests: a rank that dies before the rendezvous.
  inject.before_group = [](const tandem::comm::World& world) -> std::optional<int> {
    if (const char* r = std::getenv("TANDEM_TEST_DIE_BEFORE_RENDEZVOUS"); r && std::atoi(r) == world.rank) {
      std::fprintf(stderr, "rank %d: exiting before rendezvous (test injection)\n", world.rank);
      return 5;
    }
    // The torchrun restart test (below): on the attempts after the failed one, the last rank
    // arrives late, so the others would read the failed attempt's Gloo addresses if they could.
    const char* fail_on = std::getenv("TANDEM_TEST_FAIL_ON_ATTEMPT");
    if (fail_on && world.restart_count > std::atoi(fail_on) && world.rank == world.world_size - 1) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    return std::nullopt;
  };
  // Failure injection for the torchrun restart test (TANDEM_TEST_FAIL_ON_ATTEMPT=N): on attempt
  // N, once every rank has joined the process group and rank 0 has written a key, the last
  // rank dies and the others wait for the launcher to stop them. Every later attempt must
  // rendezvous in the same launcher's store without seeing any of attempt N's keys.
  inject.after_group = [](ProcessGroup& group) -> std::optional<int> {
    const char* fail_on = std::getenv("TANDEM_TEST_FAIL_ON_ATTEMPT");
    const auto& world = group.world();
    const std::string marker = "restart_test/written_by_attempt";
    if (fail_on && world.restart_count == std::atoi(fail_on)) {
      if (world.rank == 0) group.store()->set(marker, std::vector<uint8_t>{'x'});
      group.barrier();
      if (world.rank == world.world_size - 1) {
        std::fprintf(stderr, "rank %d: exiting on attempt %d after creating the process group (test injection)\n",
                     world.rank, world.restart_count);
        std::fflush(stderr);
        std::_Exit(3);
      }
      std::this_thread::sleep_for(std::chrono::seconds(60));  // until the launcher stops us
      return 4;
    }
    if (fail_on && world.restart_count > std::atoi(fail_on)) {
      if (group.store()->check({marker})) {
        std::fprintf(stderr, "rank %d: attempt %d sees a key that attempt %s wrote: the attempts share keys\n",
                     world.rank, world.restart_count, fail_on);
        return 6;
      }
      std::fprintf(stderr, "rank %d: attempt %d rendezvoused without seeing attempt %s's keys\n", world.rank,
                   world.restart_count, fail_on);
    }
    return std::nullopt;
  };
  return tandem::test::distributed_test_main(argc, argv, {}, inject);
}
