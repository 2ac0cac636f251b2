// DataParallel oracles: N replicas against one device training the same model on the whole
// batch. CPU replicas everywhere; DataParallelGpu (one GPU: cuda + cpu mixes, the memory report)
// and DataParallelTwoGpus (two CUDA replicas, default and pool streams) skip, visibly, without
// their GPUs (ctest: gpu.dp.one_gpu, gpu.dp.two_gpus).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <dirent.h>

#include <atomic>
#include <mutex>
#include <system_error>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <c10/core/CPUAllocator.h>

#include "dp/replica_threads.h"
#include "support/compare.h"
#include "support/errors.h"
#include "tandem/comm/cuda_info.h"
#include "tandem/dp/data_parallel.h"
#include "tandem/error.h"

using namespace tandem;
using dp::DataParallel;
using dp::DataParallelOptions;
using dp::Mode;

namespace {

struct MlpImpl : torch::nn::Cloneable<MlpImpl> {
  MlpImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(10, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(fc1(x).tanh()); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

// Not Cloneable: DataParallel needs a make_replica function for it.
struct PlainImpl : torch::nn::Module {
  PlainImpl() : fc(register_module("fc", torch::nn::Linear(10, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return fc(x); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Plain);

struct BnNetImpl : torch::nn::Cloneable<BnNetImpl> {
  BnNetImpl() { reset(); }
  void reset() override {
    fc = register_module("fc", torch::nn::Linear(10, 6));
    bn = register_module("bn", torch::nn::BatchNorm1d(6));
  }
  at::Tensor forward(const at::Tensor& x) { return bn(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(BnNet);

// Throws on a chunk of one row: with a batch of 5 on 3 replicas, replica 2 gets one row.
struct FragileImpl : torch::nn::Cloneable<FragileImpl> {
  FragileImpl() { reset(); }
  void reset() override { fc = register_module("fc", torch::nn::Linear(10, 4)); }
  at::Tensor forward(const at::Tensor& x) {
    if (x.size(0) == 1) throw std::runtime_error("a chunk of one row is not allowed here");
    return fc(x);
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Fragile);

std::vector<c10::Device> cpus(int n) { return std::vector<c10::Device>(static_cast<size_t>(n), c10::Device(c10::kCPU)); }

using test::close_at_scale;
using test::max_relative_difference;

int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n - 2;  // "." and ".."
}

// 20 SGD steps of DataParallel against the same model on one device, on the whole batch.
template <typename Holder, typename MakeDp>
double train_against_one_device(int64_t batch, MakeDp make_dp, c10::Device data_device = c10::Device(c10::kCPU)) {
  torch::manual_seed(3);
  Holder reference;
  reference->to(data_device);
  torch::manual_seed(3);
  Holder primary;
  auto model = make_dp(primary);
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD dp_opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 20; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(step);
    at::Tensor x = at::randn({batch, 10}, gen).to(data_device), y = at::randint(0, 4, {batch}, gen).to(data_device);
    ref_opt.zero_grad();
    at::cross_entropy_loss(reference->forward(x), y).backward();
    ref_opt.step();
    dp_opt.zero_grad();
    at::cross_entropy_loss(model->forward(x), y).backward();
    dp_opt.step();
  }
  return max_relative_difference(model->module()->parameters(), reference->parameters());
}

struct OracleCase {
  std::string name;
  int replicas;
  int64_t batch;
  Mode mode;
};
void PrintTo(const OracleCase& c, std::ostream* out) { *out << c.name; }

class DpOracle : public ::testing::TestWithParam<OracleCase> {};

TEST_P(DpOracle, TwentyStepsEqualOneDevice) {
  const auto& c = GetParam();
  const double diff = train_against_one_device<Mlp>(c.batch, [&](Mlp& m) {
    return DataParallel(m, DataParallelOptions().devices(cpus(c.replicas)).mode(c.mode));
  });
  std::printf("dp oracle %s: max relative difference %.3g\n", c.name.c_str(), diff);
  EXPECT_LE(diff, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Table, DpOracle,
    ::testing::Values(OracleCase{"replicate_2cpu_batch24", 2, 24, Mode::Replicate},
                      OracleCase{"replicate_3cpu_batch24", 3, 24, Mode::Replicate},
                      OracleCase{"replicate_3cpu_batch5", 3, 5, Mode::Replicate},
                      OracleCase{"replicate_3cpu_batch2", 3, 2, Mode::Replicate},
                      OracleCase{"persistent_2cpu_batch24", 2, 24, Mode::Persistent},
                      OracleCase{"persistent_3cpu_batch24", 3, 24, Mode::Persistent},
                      OracleCase{"persistent_3cpu_batch5", 3, 5, Mode::Persistent},
                      OracleCase{"persistent_3cpu_batch2", 3, 2, Mode::Persistent}),
    [](const auto& info) { return info.param.name; });

TEST(DataParallel, NonCloneableModulesUseMakeReplica) {
  for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
    const double diff = train_against_one_device<Plain>(12, [&](Plain& m) {
      return DataParallel(m, DataParallelOptions().devices(cpus(3)).mode(mode), [] { return Plain(); });
    });
    EXPECT_LE(diff, 1e-5);
  }
  Plain plain;
  try {
    DataParallel model(plain, DataParallelOptions().devices(cpus(2)).mode(Mode::Persistent));
    FAIL() << "a non-Cloneable module without make_replica was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("derive it from torch::nn::Cloneable"), std::string::npos) << e.what();
  }
}

// Note [DataParallel buffers]: running statistics advance on chunk 0 only, in both modes, and
// every replica starts each forward from the primary's buffers.
TEST(DataParallel, BatchNormStatisticsComeFromChunkZero) {
  for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
    torch::manual_seed(5);
    BnNet reference;
    torch::manual_seed(5);
    BnNet primary;
    DataParallel model(primary, DataParallelOptions().devices(cpus(3)).mode(mode));
    for (int step = 0; step < 3; ++step) {
      at::Tensor x = at::randn({9, 10}) * (step + 1) + step;
      model->forward(x).sum().backward();
      reference->forward(x.narrow(0, 0, 3)).sum().backward();  // chunk 0 of 3+3+3
    }
    EXPECT_TRUE(close_at_scale(primary->bn->running_mean, reference->bn->running_mean, 1e-6, 1e-7));
    EXPECT_TRUE(close_at_scale(primary->bn->running_var, reference->bn->running_var, 1e-6, 1e-7));
    EXPECT_EQ(primary->bn->num_batches_tracked.item<int64_t>(), 3);
    if (mode == Mode::Persistent) {
      // Replicas start every forward from the primary's buffers: replica 1's statistics after a
      // forward are the primary's previous ones updated by chunk 1 alone.
      auto snapshot = std::dynamic_pointer_cast<BnNetImpl>(primary->clone());
      at::Tensor x = at::randn({9, 10}) * 3 - 1;
      model->forward(x);
      snapshot->forward(x.narrow(0, 3, 3));
      const auto& replicas = model->replicas();
      ASSERT_EQ(replicas.size(), 3u);
      auto replica1 = std::dynamic_pointer_cast<BnNetImpl>(replicas[1]);
      EXPECT_TRUE(close_at_scale(replica1->bn->running_mean, snapshot->bn->running_mean, 1e-6, 1e-7));
      EXPECT_TRUE(close_at_scale(replica1->bn->running_var, snapshot->bn->running_var, 1e-6, 1e-7));
    }
  }
}

TEST(DataParallel, AReplicaThatThrowsIsNamedAndNoThreadIsLeft) {
  for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
    Fragile net;
    DataParallel model(net, DataParallelOptions().devices(cpus(3)).mode(mode));
    model->forward(at::randn({6, 10}));  // thread pools (OpenMP, ATen) exist from here on
    const int before = thread_count();
    try {
      model->forward(at::randn({5, 10}));
      FAIL() << "the replica's exception was lost";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "DataParallel: replica 2 on cpu failed: a chunk of one row is not allowed here");
    }
    EXPECT_EQ(thread_count(), before);
    // The module still works afterwards.
    EXPECT_EQ(model->forward(at::randn({6, 10})).size(0), 6);
  }
}

struct BadDevices {
  const char* name;
  std::vector<c10::Device> devices;
  const char* message;
};
void PrintTo(const BadDevices& b, std::ostream* out) { *out << b.name; }
class DpRejects : public ::testing::TestWithParam<BadDevices> {};

TEST_P(DpRejects, WithAClearError) {
  Mlp net;
  try {
    DataParallel model(net, DataParallelOptions().devices(GetParam().devices));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), GetParam().message);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, DpRejects,
    ::testing::Values(
        BadDevices{"DuplicatedGpu", {c10::Device("cuda:0"), c10::Device("cuda:0")},
                   "DataParallel: device cuda:0 appears twice: each GPU holds one replica (only the cpu may repeat)"},
        BadDevices{"MetaDevice", {c10::Device("meta")}, "DataParallel: device meta is not supported: use cpu or cuda devices"},
        BadDevices{"EmptyList", {}, "DataParallel: the device list is empty"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(DataParallel, RejectsMissingDevicesAndEmptyBatches) {
  Mlp net;
  const int gpus = comm::cuda_device_count();
  const std::string missing = "cuda:" + std::to_string(gpus);
  try {
    DataParallel model(net, DataParallelOptions().devices({c10::Device(c10::kCPU), c10::Device(missing)}));
    FAIL() << "a missing device was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "DataParallel: device " + missing + " does not exist (" + std::to_string(gpus) +
                                         " CUDA devices visible)");
  }
  try {
    DataParallel model(net, DataParallelOptions().devices(cpus(2)));
    model->forward(at::empty({0, 10}));
    FAIL() << "an empty batch was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "DataParallel: the batch is empty");
  }
}

TEST(DataParallel, MemoryReportShowsThePrimaryHoldsMore) {
  Mlp net;
  DataParallel model(net, DataParallelOptions().devices(cpus(3)).mode(Mode::Persistent).track_cpu_memory(true));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  model->reset_memory_peaks();
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    at::cross_entropy_loss(model->forward(at::randn({300, 10})), at::randint(0, 4, {300})).backward();
    opt.step();
  }
  auto report = model->memory_report();
  report.add_optimizer(opt);
  std::printf("%s", report.describe().c_str());
  ASSERT_EQ(report.replicas.size(), 3u);
  const int64_t param_bytes = (10 * 32 + 32 + 32 * 4 + 4) * 4;
  EXPECT_EQ(report.replicas[0].parameter_bytes, param_bytes);
  EXPECT_EQ(report.replicas[0].optimizer_bytes, param_bytes);  // one momentum buffer per parameter
  EXPECT_EQ(report.replicas[1].optimizer_bytes, 0);
  for (size_t k = 0; k < 3; ++k) EXPECT_GT(report.replicas[k].activation_peak_bytes, 0);
  // The primary runs its own chunk and then holds the gathered output; the optimizer's state is
  // on the primary alone.
  EXPECT_GE(report.replicas[0].activation_peak_bytes, report.replicas[1].activation_peak_bytes);
  EXPECT_GT(report.replicas[0].total(), report.replicas[1].total());
}

// In a fresh process (a re-executed "threadsafe" death test), since an earlier test may have
// installed the tracking allocator for good: only track_cpu_memory(true) replaces LibTorch's.
TEST(DataParallel, TheTrackingAllocatorIsOptIn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        c10::Allocator* before = c10::GetCPUAllocator();
        Mlp net;
        DataParallel plain(net, DataParallelOptions().devices(cpus(2)));
        plain->forward(at::randn({4, 10})).sum().backward();
        const bool untouched = c10::GetCPUAllocator() == before;
        const auto report = plain->memory_report();
        const bool says_so = !report.replicas[0].activations_tracked &&
                             report.describe().find("activations not tracked") != std::string::npos;
        DataParallel tracked(net, DataParallelOptions().devices(cpus(2)).track_cpu_memory(true));
        const bool replaced = c10::GetCPUAllocator() != before;
        std::fprintf(stderr, "untouched %d, says so %d, replaced when asked %d\n", untouched, says_so, replaced);
        std::exit(untouched && says_so && replaced ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "untouched 1, says so 1, replaced when asked 1");
}

// A replica thread that cannot start: the threads already started are joined (no
// std::terminate from a joinable std::thread) and the failure is one clear error.
TEST(DataParallel, AThreadThatCannotStartJoinsTheOthersAndIsNamed) {
  std::atomic<int> ran{0};
  int started = 0;
  auto start = [&](std::function<void()> body) {
    if (++started == 3) throw std::system_error(EAGAIN, std::generic_category());  // what std::thread throws
    return std::thread(std::move(body));
  };
  EXPECT_ERROR(dp::run_replicas(5, [&](size_t) { ++ran; }, start),
               "DataParallel: cannot start the thread of replica 3 of 5: Resource temporarily unavailable");
  EXPECT_EQ(ran.load(), 2);  // replicas 1 and 2 ran and were joined; replica 0 was not started
  ran = 0;
  dp::run_replicas(5, [&](size_t) { ++ran; });
  EXPECT_EQ(ran.load(), 5);
}

// Persistent mode: a backward that raised left gradients in the replicas; they must not leak
// into the next step (the result equals a run that skipped the failed step).
TEST(DataParallel, AFailedBackwardLeavesNothingBehind) {
  for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
    torch::manual_seed(3);
    Mlp reference;
    torch::manual_seed(3);
    Mlp primary;
    DataParallel model(primary, DataParallelOptions().devices(cpus(3)).mode(mode));
    torch::optim::SGD ref_opt(reference->parameters(), 0.1), dp_opt(model->parameters(), 0.1);
    for (int step = 0; step < 4; ++step) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(step);
      at::Tensor x = at::randn({12, 10}, gen), y = at::randint(0, 4, {12}, gen);
      dp_opt.zero_grad();
      at::Tensor out = model->forward(x);
      if (step == 1) {
        // Backward raises on the primary's rows; the replicas' rows may have their gradients already.
        at::Tensor poisoned = out.narrow(0, 0, 4).clone();
        poisoned.register_hook([](at::Tensor) -> at::Tensor { throw std::runtime_error("injected"); });
        EXPECT_ERROR_HAS((at::cross_entropy_loss(at::cat({poisoned, out.narrow(0, 4, 8)}), y).backward()), "injected");
        continue;
      }
      at::cross_entropy_loss(out, y).backward();
      dp_opt.step();
      ref_opt.zero_grad();
      at::cross_entropy_loss(reference->forward(x), y).backward();
      ref_opt.step();
    }
    EXPECT_LE(max_relative_difference(model->module()->parameters(), reference->parameters()), 1e-5);
  }
}

// Note [DataParallel memory accounting]: on CUDA the allocator's peak already holds parameters,
// gradients and optimizer state; total() is that peak, not the peak plus them again. A report
// built by hand for cuda:0: no GPU needed.
TEST(DataParallelMemory, ACudaReplicaCountsTheDevicePeakOnce) {
  dp::MemoryReport report;
  dp::DeviceMemory gpu;
  gpu.device = c10::Device("cuda:0");
  gpu.parameter_bytes = 1'000'000;
  gpu.gradient_bytes = 1'000'000;
  gpu.device_peak_bytes = 5'000'000;
  gpu.derive_activations();
  report.replicas.push_back(gpu);
  dp::DeviceMemory cpu;  // for contrast: on CPU the figures are separate measurements, summed
  cpu.replica = 1;
  cpu.parameter_bytes = 1'000'000;
  cpu.gradient_bytes = 1'000'000;
  cpu.activation_peak_bytes = 500'000;
  report.replicas.push_back(cpu);
  EXPECT_EQ(report.replicas[0].activation_peak_bytes, 3'000'000);
  EXPECT_EQ(report.replicas[0].total(), 5'000'000);  // 8'000'000 would count parameters and gradients twice
  EXPECT_EQ(report.replicas[1].total(), 2'500'000);

  // The optimizer's state (one momentum buffer of 250'000 floats) lives on the primary's device:
  // the peak held it too, so the activation figure shrinks and the total stays the peak.
  at::Tensor w = at::zeros({250'000}).requires_grad_();
  w.mutable_grad() = at::ones({250'000});
  torch::optim::SGD opt(std::vector<at::Tensor>{w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  opt.step();
  report.add_optimizer(opt);
  EXPECT_EQ(report.replicas[0].optimizer_bytes, 1'000'000);
  EXPECT_EQ(report.replicas[0].activation_peak_bytes, 2'000'000);
  EXPECT_EQ(report.replicas[0].total(), 5'000'000);
  ASSERT_TRUE(report.replicas[0].device_peak_bytes.has_value());
  EXPECT_EQ(*report.replicas[0].device_peak_bytes, 5'000'000);  // the raw peak stays visible
  EXPECT_FALSE(report.replicas[1].device_peak_bytes.has_value());
  EXPECT_THAT(report.describe(),
              ::testing::HasSubstr("replica 0 (cuda:0): parameters 1.00 MB, gradients 1.00 MB, activations 2.00 MB, "
                                   "optimizer 1.00 MB, total 5.00 MB (the device's peak)\n"));

  // Peaks reset after the step can hold less than the three figures: activations 0, never negative.
  dp::DeviceMemory low = gpu;
  low.device_peak_bytes = 1'500'000;
  low.derive_activations();
  EXPECT_EQ(low.activation_peak_bytes, 0);
  EXPECT_EQ(low.total(), 1'500'000);
}

// A frozen parameter of the primary gets no gradient from the replicas, in either mode, and one
// unfrozen later gets every replica's again.
TEST(DataParallel, FrozenParametersStayFrozenUntilUnfrozen) {
  for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
    SCOPED_TRACE(mode == Mode::Replicate ? "replicate" : "persistent");
    torch::manual_seed(3);
    Mlp reference;
    torch::manual_seed(3);
    Mlp primary;
    reference->fc1->weight.requires_grad_(false);
    primary->fc1->weight.requires_grad_(false);
    DataParallel model(primary, DataParallelOptions().devices(cpus(3)).mode(mode));
    at::Tensor x = at::randn({12, 10}), y = at::randint(0, 4, {12});
    at::cross_entropy_loss(model->forward(x), y).backward();
    at::cross_entropy_loss(reference->forward(x), y).backward();
    EXPECT_FALSE(primary->fc1->weight.grad().defined());
    EXPECT_TRUE(close_at_scale(primary->fc1->bias.grad(), reference->fc1->bias.grad(), 1e-5));
    EXPECT_TRUE(close_at_scale(primary->fc2->weight.grad(), reference->fc2->weight.grad(), 1e-5));

    reference->fc1->weight.requires_grad_(true);
    primary->fc1->weight.requires_grad_(true);
    at::cross_entropy_loss(model->forward(x), y).backward();
    at::cross_entropy_loss(reference->forward(x), y).backward();
    ASSERT_TRUE(primary->fc1->weight.grad().defined());
    EXPECT_TRUE(close_at_scale(primary->fc1->weight.grad(), reference->fc1->weight.grad(), 1e-5));
    EXPECT_TRUE(close_at_scale(primary->fc2->weight.grad(), reference->fc2->weight.grad(), 1e-5));
  }
}

// ---- GPU tests (ctest label gpu; skipped, visibly, without enough devices) ----

#define SKIP_UNLESS_CUDA_DEVICES(n)                                                                     \
  do {                                                                                                \
    const int visible_ = comm::cuda_device_count();                                                   \
    if (visible_ < (n)) {                                                                             \
      GTEST_SKIP() << "needs " << (n) << ((n) == 1 ? " CUDA device, " : " CUDA devices, ") << visible_ \
                   << " visible";                                                                     \
    }                                                                                                 \
  } while (false)

// The Mlp, plus a record of where each replica's forward ran: the device and stream its thread
// had current (Note [DataParallel streams]). Clones share the record.
struct ForwardSeen {
  c10::Device input;
  c10::Device current;
  c10::Stream stream;
};
struct ProbeLog {
  std::mutex mutex;
  std::vector<ForwardSeen> seen;
};
struct ProbedMlpImpl : torch::nn::Cloneable<ProbedMlpImpl> {
  ProbedMlpImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(10, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    if (x.is_cuda()) {
      const c10::impl::VirtualGuardImpl cuda(c10::kCUDA);
      std::lock_guard<std::mutex> lock(log->mutex);
      log->seen.push_back({x.device(), cuda.getDevice(), cuda.getStream(x.device())});
    }
    return fc2(fc1(x).tanh());
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  std::shared_ptr<ProbeLog> log = std::make_shared<ProbeLog>();
};
TORCH_MODULE(ProbedMlp);

std::vector<c10::Device> parse_devices(const std::vector<const char*>& names) {
  std::vector<c10::Device> devices;
  for (const char* n : names) devices.emplace_back(n);
  return devices;
}

std::string joined(const std::vector<c10::Device>& devices) {
  std::string out;
  for (const auto& d : devices) out += (out.empty() ? "" : ",") + d.str();
  return out;
}

// The current stream of every visible GPU: a fresh pool stream each (`pool`), else the default.
std::vector<c10::Stream> caller_streams(bool pool) {
  const c10::impl::VirtualGuardImpl cuda(c10::kCUDA);
  std::vector<c10::Stream> streams;
  for (int i = 0; i < comm::cuda_device_count(); ++i) {
    const c10::Device d(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
    streams.push_back(pool ? cuda.getStreamFromGlobalPool(d) : cuda.getDefaultStream(d));
  }
  return streams;
}

// 20 steps of DataParallel over `devices` against one device (the primary's), with the caller
// on pool streams (`pool`) or the default ones all along; then every CUDA replica's forward must
// have run with its device current and on the caller's stream of that device.
void expect_oracle_on(const std::vector<c10::Device>& devices, Mode mode, int64_t batch, bool pool) {
  const std::string what = joined(devices) + (mode == Mode::Replicate ? " replicate" : " persistent") + " batch " +
                           std::to_string(batch) + (pool ? " on pool streams" : " on default streams");
  SCOPED_TRACE(what);
  const std::vector<c10::Stream> streams = caller_streams(pool);
  std::shared_ptr<ProbeLog> log;
  double diff = 0;
  {
    c10::MultiStreamGuard current(streams);
    diff = train_against_one_device<ProbedMlp>(
        batch,
        [&](ProbedMlp& m) {
          log = m->log;
          return DataParallel(m, DataParallelOptions().devices(devices).mode(mode));
        },
        devices.front());
    for (const auto& s : streams) s.synchronize();
  }
  std::printf("dp oracle %s: max relative difference %.3g\n", what.c_str(), diff);
  EXPECT_LE(diff, 1e-5);
  ASSERT_TRUE(log);
  for (const auto& seen : log->seen) {
    EXPECT_EQ(seen.current, seen.input) << "a replica on " << seen.input << " ran with " << seen.current << " current";
    const auto expected = std::find_if(streams.begin(), streams.end(), [&](const c10::Stream& s) { return s.device() == seen.input; });
    ASSERT_NE(expected, streams.end());
    EXPECT_EQ(seen.stream, *expected) << "a replica on " << seen.input << " ran on another stream than the caller's";
  }
  // Every case here has a batch of at least one row per device: every replica ran every step.
  ASSERT_GE(batch, static_cast<int64_t>(devices.size()));
  const auto cuda_replicas = std::count_if(devices.begin(), devices.end(), [](const c10::Device& d) { return d.is_cuda(); });
  EXPECT_EQ(log->seen.size(), static_cast<size_t>(20 * cuda_replicas));
}

// One GPU still runs the multi-device path: chunks copied to the CPU replicas, outputs gathered
// onto the GPU, gradients summed across devices, in both modes, on the default stream and on a
// pool stream; and the other way round, a CPU primary with a replica on the GPU.
TEST(DataParallelGpu, CudaAndCpuReplicasMatchOneDevice) {
  SKIP_UNLESS_CUDA_DEVICES(1);
  for (bool pool : {false, true}) {
    for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
      expect_oracle_on(parse_devices({"cuda:0", "cpu", "cpu"}), mode, 24, pool);
      expect_oracle_on(parse_devices({"cuda:0", "cpu", "cpu"}), mode, 5, pool);
      expect_oracle_on(parse_devices({"cpu", "cuda:0"}), mode, 24, pool);
    }
  }
}

// Note [DataParallel memory accounting] on a real device: total() is the allocator's peak, read
// here independently through at::accelerator, and the activation figure is what the parameters,
// gradients and optimizer state leave of it.
TEST(DataParallelGpu, MemoryReportTotalIsTheDevicePeak) {
  SKIP_UNLESS_CUDA_DEVICES(1);
  for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
    SCOPED_TRACE(mode == Mode::Replicate ? "replicate" : "persistent");
    Mlp net;
    DataParallel model(net, DataParallelOptions()
                                .devices(parse_devices({"cuda:0", "cpu"}))
                                .mode(mode)
                                .track_cpu_memory(true));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    model->reset_memory_peaks();
    for (int i = 0; i < 2; ++i) {
      opt.zero_grad();
      at::Tensor x = at::randn({300, 10}).to(c10::Device("cuda:0")), y = at::randint(0, 4, {300}).to(c10::Device("cuda:0"));
      at::cross_entropy_loss(model->forward(x), y).backward();
      opt.step();
    }
    auto report = model->memory_report();
    report.add_optimizer(opt);
    const int64_t peak = at::accelerator::getDeviceStats(0)
                             .allocated_bytes[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)]
                             .peak;
    std::printf("%s", report.describe().c_str());
    ASSERT_EQ(report.replicas.size(), 2u);
    const auto& gpu = report.replicas[0];
    const int64_t param_bytes = (10 * 32 + 32 + 32 * 4 + 4) * 4;
    EXPECT_EQ(gpu.parameter_bytes, param_bytes);
    EXPECT_EQ(gpu.optimizer_bytes, param_bytes);
    ASSERT_TRUE(gpu.device_peak_bytes.has_value());
    EXPECT_EQ(*gpu.device_peak_bytes, peak);
    EXPECT_EQ(gpu.total(), peak);
    EXPECT_GE(peak, gpu.parameter_bytes + gpu.gradient_bytes + gpu.optimizer_bytes);  // all alive on cuda:0 now
    EXPECT_EQ(gpu.activation_peak_bytes, peak - gpu.parameter_bytes - gpu.gradient_bytes - gpu.optimizer_bytes);
    const auto& cpu = report.replicas[1];
    EXPECT_FALSE(cpu.device_peak_bytes.has_value());
    EXPECT_GT(cpu.activation_peak_bytes, 0);
    EXPECT_EQ(cpu.total(), cpu.parameter_bytes + cpu.gradient_bytes + cpu.activation_peak_bytes);
  }
}

TEST(DataParallelGpu, OracleOnEveryVisibleGpu) {
  SKIP_UNLESS_CUDA_DEVICES(1);
  const int gpus = comm::cuda_device_count();
  std::vector<c10::Device> devices;
  for (int i = 0; i < gpus; ++i) devices.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
  for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
    const double diff = train_against_one_device<Mlp>(
        24, [&](Mlp& m) { return DataParallel(m, DataParallelOptions().devices(devices).mode(mode)); },
        devices.front());
    std::printf("gpu dp oracle on %d GPUs: %.3g\n", gpus, diff);
    EXPECT_LE(diff, 1e-5);
  }
}

TEST(DataParallelTwoGpus, TwoCudaReplicasMatchOneDevice) {
  SKIP_UNLESS_CUDA_DEVICES(2);
  for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
    expect_oracle_on(parse_devices({"cuda:0", "cuda:1"}), mode, 24, false);
    expect_oracle_on(parse_devices({"cuda:0", "cuda:1"}), mode, 5, false);
    expect_oracle_on(parse_devices({"cuda:1", "cuda:0"}), mode, 24, false);  // the primary not on device 0
  }
}

// The caller works on pool streams, not the default ones: the replicas, the copies into them,
// the gather and the gradient sums must all stay ordered with the caller's streams.
TEST(DataParallelTwoGpus, NonDefaultCallerStreams) {
  SKIP_UNLESS_CUDA_DEVICES(2);
  const c10::impl::VirtualGuardImpl cuda(c10::kCUDA);
  for (const auto& s : caller_streams(true)) ASSERT_NE(s, cuda.getDefaultStream(s.device()));
  for (Mode mode : {Mode::Replicate, Mode::Persistent}) {
    expect_oracle_on(parse_devices({"cuda:0", "cuda:1"}), mode, 24, true);
    expect_oracle_on(parse_devices({"cuda:0", "cuda:1", "cpu"}), mode, 24, true);
    expect_oracle_on(parse_devices({"cuda:0", "cuda:1"}), mode, 5, true);
  }
}

}  // namespace
