// One measurement of Tandem DDP, run as every rank of a `tandem run` job (or alone).
//   tandem_ddp_bench --model mlp|cnn|transformer --mode ddp|plain|no_sync|allreduce
//                    [--batch 64] [--steps 30] [--warmup 5] [--bucket-view] [--out FILE]
// Modes: ddp (synced steps), plain (no DDP at all: the baseline loop), no_sync (DDP with every
// step inside no_sync: compute without communication), allreduce (the raw backend all-reduce of
// the model's gradient bytes, flat and in DDP's bucket layout), dp_replicate / dp_persistent
// (DataParallel over --replicas CPU replicas in one process; --batch is then the whole batch),
// accelerate (the ddp loop written with tandem::Accelerator).
// --threads sets the process's intra-op threads (default 1).
// Rank 0 writes one JSON object (to --out, or stdout): step times, samples/s, peak RSS.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <optional>

#include <CLI/CLI.hpp>
#include <torch/optim/sgd.h>

#include "tandem/accelerate/accelerator.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/dp/data_parallel.h"
#include "workloads.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string model = "mlp", mode = "ddp", out;
  int64_t batch = 64;
  int steps = 30, warmup = 5, threads = 1, replicas = 2;
  bool bucket_view = false;
  bool untracked = false;  // DataParallel without track_cpu_memory: no per-replica activation figures
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double pos = p * (v.size() - 1);
  const auto lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

double median_or_zero(const std::vector<double>& v) { return v.empty() ? 0.0 : percentile(v, 0.5); }

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;
}

template <typename Step>
std::vector<double> time_steps(const Options& o, Step step) {
  std::vector<double> times;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    auto start = Clock::now();
    step();
    if (i >= o.warmup) times.push_back(seconds_since(start));
  }
  return times;
}

// Where a step's time goes: forward, backward (including DDP's hooks and the wait for the last
// bucket), optimizer step. Medians over the timed steps.
struct Phases {
  std::vector<double> forward, backward, optimizer;
  template <typename F>
  void time(std::vector<double>& into, F&& f) {
    auto start = Clock::now();
    f();
    into.push_back(seconds_since(start));
  }
};

// DataParallel's per-replica memory totals (bytes), filled by the dp modes.
std::vector<int64_t> replica_bytes;

template <typename Holder>
std::vector<double> train(const Options& o, comm::ProcessGroup& pg, int64_t& grad_bytes,
                          std::vector<int64_t>& bucket_bytes, Phases& phases) {
  torch::manual_seed(0);
  Holder net;
  auto [x, y] = bench::synthetic_batch(o.model, o.batch, 100 + pg.rank());
  for (const auto& p : net->parameters()) grad_bytes += p.numel() * p.element_size();
  if (o.mode == "dp_replicate" || o.mode == "dp_persistent") {
    dp::DataParallel model(net, dp::DataParallelOptions()
                                    .devices(std::vector<c10::Device>(static_cast<size_t>(o.replicas), c10::kCPU))
                                    .mode(o.mode == "dp_replicate" ? dp::Mode::Replicate : dp::Mode::Persistent)
                                    .track_cpu_memory(!o.untracked),
                        [] { return Holder(); });
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    model->reset_memory_peaks();
    auto times = time_steps(o, [&] {
      opt.zero_grad();
      at::Tensor loss;
      phases.time(phases.forward, [&] { loss = at::cross_entropy_loss(model->forward(x), y); });
      phases.time(phases.backward, [&] { loss.backward(); });
      phases.time(phases.optimizer, [&] { opt.step(); });
    });
    auto report = model->memory_report();
    report.add_optimizer(opt);
    for (const auto& r : report.replicas) replica_bytes.push_back(r.total());
    return times;
  }
  if (o.mode == "plain") {
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    return time_steps(o, [&] {
      opt.zero_grad();
      at::Tensor loss;
      phases.time(phases.forward, [&] { loss = at::cross_entropy_loss(net->forward(x), y); });
      phases.time(phases.backward, [&] { loss.backward(); });
      phases.time(phases.optimizer, [&] { opt.step(); });
    });
  }
  if (o.mode == "accelerate") {  // the same DDP loop through tandem::Accelerator
    Accelerator acc(std::shared_ptr<comm::ProcessGroup>(&pg, [](auto*) {}),
                    AcceleratorOptions().strategy(Strategy::Ddp).progress(false).ddp(
                        ddp::DistributedDataParallelOptions().gradient_as_bucket_view(o.bucket_view)));
    auto model = acc.prepare_model(net);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    acc.prepare_optimizer(opt);
    return time_steps(o, [&] {
      at::Tensor loss;
      auto sync = acc.accumulate(model);
      phases.time(phases.forward, [&] { loss = at::cross_entropy_loss(model->forward(x), y); });
      phases.time(phases.backward, [&] { acc.backward(loss); });
      phases.time(phases.optimizer, [&] {
        acc.step(opt);
        acc.zero_grad(opt);
      });
    });
  }
  ddp::DistributedDataParallel model(net, std::shared_ptr<comm::ProcessGroup>(&pg, [](auto*) {}),
                                     ddp::DistributedDataParallelOptions().gradient_as_bucket_view(o.bucket_view));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const bool sync = o.mode == "ddp";
  auto times = time_steps(o, [&] {
    opt.zero_grad(/*set_to_none=*/!o.bucket_view);
    at::Tensor loss;
    model->set_require_backward_grad_sync(sync);  // the no_sync measurement: local accumulation only
    phases.time(phases.forward, [&] { loss = at::cross_entropy_loss(model->forward(x), y); });
    phases.time(phases.backward, [&] { loss.backward(); });
    phases.time(phases.optimizer, [&] { opt.step(); });
  });
  for (const auto& b : model->reducer().buckets()) {
    if (b.contents.defined()) bucket_bytes.push_back(b.contents.numel() * b.contents.element_size());
  }
  return times;
}

std::vector<double> allreduce(const Options& o, comm::ProcessGroup& pg, int64_t grad_bytes,
                              const std::vector<int64_t>& bucket_bytes, bool bucketed) {
  std::vector<at::Tensor> tensors;
  if (bucketed) {
    for (auto bytes : bucket_bytes) tensors.push_back(at::ones({bytes / 4}));
  } else {
    tensors.push_back(at::ones({grad_bytes / 4}));
  }
  return time_steps(o, [&] {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : tensors) works.push_back(pg.all_reduce_async(t));
    for (auto& w : works) pg.wait(w, "benchmark all_reduce");
  });
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Tandem DDP benchmark (one measurement)"};
  app.add_option("--model", o.model)->check(CLI::IsMember({"mlp", "cnn", "transformer"}));
  app.add_option("--mode", o.mode)
      ->check(CLI::IsMember({"ddp", "plain", "no_sync", "allreduce", "dp_replicate", "dp_persistent", "accelerate"}));
  app.add_option("--threads", o.threads)->check(CLI::PositiveNumber);
  app.add_option("--replicas", o.replicas)->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch)->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps)->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup)->check(CLI::NonNegativeNumber);
  app.add_flag("--bucket-view", o.bucket_view);
  app.add_flag("--untracked", o.untracked, "DataParallel modes: leave LibTorch's CPU allocator alone");
  app.add_option("--out", o.out);
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(o.threads);
    auto pg = comm::ProcessGroup::create(comm::World::from_env());
    int64_t grad_bytes = 0;
    std::vector<int64_t> bucket_bytes;
    Phases phases;
    std::vector<double> times;
    Options probe = o;
    auto run_model = [&](const Options& opts) {
      if (o.model == "mlp") return train<bench::Mlp>(opts, *pg, grad_bytes, bucket_bytes, phases);
      if (o.model == "cnn") return train<bench::Cnn>(opts, *pg, grad_bytes, bucket_bytes, phases);
      return train<bench::Transformer>(opts, *pg, grad_bytes, bucket_bytes, phases);
    };
    double flat_p50 = 0, bucketed_p50 = 0;
    if (o.mode == "allreduce") {
      probe.mode = "no_sync";  // learn the gradient bytes and DDP's bucket layout, untimed
      probe.steps = 1;
      probe.warmup = 0;
      run_model(probe);
      phases = Phases();
      auto flat = allreduce(o, *pg, grad_bytes, bucket_bytes, false);
      times = allreduce(o, *pg, grad_bytes, bucket_bytes, true);
      flat_p50 = percentile(flat, 0.5);
      bucketed_p50 = percentile(times, 0.5);
    } else {
      times = run_model(o);
    }
    const double p50 = percentile(times, 0.5), p95 = percentile(times, 0.95);
    at::Tensor mine = at::tensor({p50, peak_rss_mb()}, at::kDouble);
    auto all = pg->all_gather(mine);  // every rank's numbers reach rank 0
    if (pg->rank() == 0) {
      std::string ranks_p50 = "[", ranks_rss = "[", replicas_json = "[";
      for (size_t k = 0; k < replica_bytes.size(); ++k) replicas_json += (k ? "," : "") + std::to_string(replica_bytes[k]);
      for (int r = 0; r < pg->size(); ++r) {
        ranks_p50 += (r ? "," : "") + std::to_string(all[r][0].item<double>());
        ranks_rss += (r ? "," : "") + std::to_string(all[r][1].item<double>());
      }
      char json[4096];
      std::snprintf(json, sizeof(json),
                    "{\"impl\":\"tandem\",\"model\":\"%s\",\"mode\":\"%s\",\"world\":%d,\"batch\":%lld,"
                    "\"bucket_view\":%s,\"steps\":%d,\"p50_s\":%.6g,\"p95_s\":%.6g,\"samples_per_s_per_rank\":%.6g,"
                    "\"grad_bytes\":%lld,\"buckets\":%zu,\"flat_allreduce_p50_s\":%.6g,"
                    "\"bucketed_allreduce_p50_s\":%.6g,\"forward_p50_s\":%.6g,\"backward_p50_s\":%.6g,"
                    "\"optimizer_p50_s\":%.6g,\"threads\":%d,\"replica_bytes\":%s],"
                    "\"rank_p50_s\":%s],\"rank_peak_rss_mb\":%s]}\n",
                    o.model.c_str(), o.mode.c_str(), pg->size(), static_cast<long long>(o.batch),
                    o.bucket_view ? "true" : "false", o.steps, p50, p95, o.batch / p50,
                    static_cast<long long>(grad_bytes), bucket_bytes.size(), flat_p50, bucketed_p50,
                    median_or_zero(phases.forward), median_or_zero(phases.backward),
                    median_or_zero(phases.optimizer), o.threads, replicas_json.c_str(), ranks_p50.c_str(),
                    ranks_rss.c_str());
      if (o.out.empty()) {
        std::fputs(json, stdout);
      } else {
        std::ofstream(o.out, std::ios::app) << json;
      }
    }
    pg->barrier();
  } catch (const Error& e) {
    std::fprintf(stderr, "tandem_ddp_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem_ddp_bench: %s\n", tandem::one_line(e).c_str());
    return 1;
  }
  return 0;
}
