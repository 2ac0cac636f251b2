#include "plan/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "bench/frontier.h"
#include "plan/search.h"
#include "tandem/error.h"

namespace tandem::plan {

namespace {

std::vector<ValidationPoint> validate_points(const nlohmann::json& results, const Profile& cpu);
}  // namespace

Configuration frontier_configuration(const std::string& strategy, int world, int64_t batch) {
  Configuration c;
  const int tp = strategy == "tp" ? world : strategy == "fsdp+tp" ? 2 : 1;
  TANDEM_CHECK(world % tp == 0, strategy, " at ", world, " processes: the frontier runs it on a multiple of ", tp);
  c.tp = tp;
  c.dp = world / tp;
  c.local_batch = batch * tp;  // a TP group trains batch x its size sequences
  c.checkpointing = strategy == "fsdp-checkpoint" || strategy == "ddp-checkpoint" ? Checkpointing::Full
                                                                                  : Checkpointing::None;
  c.sequence_parallel = false;  // bench::gpt_tp_plan() cuts the linears and the embedding only
  if (strategy == "zero1" || strategy == "zero2") {
    c.sharding = strategy;
    c.shard = c.dp;
  } else if (strategy.rfind("fsdp", 0) == 0) {
    c.sharding = "fsdp";
    c.shard = c.dp;
  } else {
    TANDEM_CHECK(strategy == "ddp" || strategy == "ddp-checkpoint" || strategy == "tp", "unknown frontier strategy '",
                 strategy, "'");
    c.sharding = "ddp";
  }
  return c;
}

std::vector<ValidationPoint> validate_frontier(const nlohmann::json& results, const Profile& cpu) {
  try {
    return validate_points(results, cpu);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("not the results.json of a tandem bench --memory-budget run: ") + e.what());
  }
}

namespace {

std::vector<ValidationPoint> validate_points(const nlohmann::json& results, const Profile& cpu) {
  TANDEM_CHECK(results.is_object() && results.value("kind", std::string()) == "memory-frontier" && results.contains("rows"),
               "not the results.json of a tandem bench --memory-budget run");
  TANDEM_CHECK(cpu.device == "cpu", "the frontier's probes are CPU processes: plan them with --profile cpu (or a CPU "
                                    "profile file), not ", cpu.name);
  const int world = results.at("world").get<int>();
  TANDEM_CHECK(world >= 1 && world <= 4096, "results.json: world ", world, " is not a number of processes");
  const std::string scale = results.value("scale", std::string("cpu"));
  std::vector<ValidationPoint> out;
  for (const auto& row : results.at("rows")) {
    if (row.value("impl", std::string()) != "tandem") continue;
    const std::string strategy = row.at("strategy").get<std::string>();
    for (const auto& probe : row.at("probes")) {
      if (!probe.value("fits", false) || probe.value("peak_charge_bytes", int64_t{0}) <= 0) continue;
      const int index = probe.at("index").get<int>();
      Job job;
      job.model = frontier_family_model(scale, index);
      job.precision = "fp32";
      job.profile = cpu;
      job.profile.devices_per_node = world;
      job.profile.nodes = 1;
      const int64_t batch = bench::family_member(scale, index).batch;  // sequences per process
      job.global_batch = batch * world;
      const Configuration c = frontier_configuration(strategy, world, batch);
      const Estimate e = estimate(job, c);
      TANDEM_CHECK(e.buildable, strategy, " at ", world, " processes: ", e.refusal);
      ValidationPoint p;
      p.strategy = strategy;
      p.model = job.model.name;
      p.world = world;
      p.measured_bytes = probe.at("peak_charge_bytes").get<double>();
      p.predicted_bytes = e.memory.total();
      p.measured_tokens_per_s = probe.value("tokens_per_s", 0.0);
      p.predicted_tokens_per_s = e.tokens_per_s_per_device * world;
      out.push_back(p);
    }
  }
  return out;
}

int frontier_index(const std::string& model) { return std::stoi(model.substr(model.rfind('-') + 1)); }
}  // namespace

Profile fit_cpu_profile(const nlohmann::json& results, Profile base) {
  TANDEM_CHECK(base.device == "cpu", "--fit-profile fits a CPU profile (got ", base.name, ", a ", base.device, " one)");
  base.devices_per_node = results.is_object() ? results.value("world", 0) : 0;
  const auto ddp_timed = [](const std::vector<ValidationPoint>& points) {
    std::vector<ValidationPoint> out;
    for (const auto& p : points) {
      if (p.strategy == "ddp" && p.measured_tokens_per_s > 0) out.push_back(p);
    }
    return out;
  };
  const auto first = validate_frontier(results, base);
  TANDEM_CHECK(ddp_timed(first).size() >= 3,
               "--fit-profile needs a tandem bench --memory-budget run with ddp among its strategies and at least "
               "three of its probes timed");
  // The runtime's own: the median charge, beyond the plan's state and activations, of the
  // smallest member's probes (where the runtime is most of the peak).
  std::string smallest = first.front().model;
  for (const auto& p : first) {
    if (frontier_index(p.model) < frontier_index(smallest)) smallest = p.model;
  }
  std::vector<double> beyond;
  for (const auto& p : first) {
    if (p.model == smallest) beyond.push_back(p.measured_bytes - (p.predicted_bytes - static_cast<double>(base.runtime_bytes)));
  }
  std::sort(beyond.begin(), beyond.end());
  base.runtime_bytes = static_cast<int64_t>(std::max(0.0, beyond[beyond.size() / 2]));
  // A grid over the three rates, each a factor of about 1.2 apart: the least squares of the
  // relative step-time errors wins.
  Profile best = base;
  double best_error = 1e30, best_worst = 0;
  for (double flops = 10e9; flops <= 2e12; flops *= 1.2) {
    for (double bandwidth = 0.5e9; bandwidth <= 100e9; bandwidth *= 1.25) {
      for (double overhead : {0.0, 2e-6, 4e-6, 8e-6, 12e-6, 16e-6, 24e-6, 32e-6}) {
        Profile p = base;
        p.fp32_flops = flops, p.efficiency = 1.0, p.memory_bandwidth = bandwidth, p.op_overhead_s = overhead;
        double squares = 0, worst = 0;
        for (const auto& point : ddp_timed(validate_frontier(results, p))) {
          squares += point.time_error() * point.time_error();
          worst = std::max(worst, std::fabs(point.time_error()));
        }
        if (squares < best_error) best_error = squares, best = p, best_worst = worst;
      }
    }
  }
  best.name = "fitted";
  char description[200];
  std::snprintf(description, sizeof(description),
                "fitted by tandem plan --fit-profile to a memory-frontier run's DDP probes at %d processes "
                "(worst step-time error %.0f %%)",
                best.devices_per_node, 100 * best_worst);
  best.description = description;
  return best;
}

std::string validation_table(const std::vector<ValidationPoint>& points) {
  std::ostringstream s;
  s << "| strategy | model | processes | cgroup peak MiB | planned MiB | error | tokens/s | planned | step error |\n"
    << "|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  int memory_ok = 0, time_ok = 0, timed = 0;
  char buf[256];
  for (const auto& p : points) {
    const bool has_time = p.measured_tokens_per_s > 0;
    std::snprintf(buf, sizeof(buf), "| %s | %s | %d | %.0f | %.0f | %+.1f %% | %.0f | %.0f | %s |\n", p.strategy.c_str(),
                  p.model.c_str(), p.world, p.measured_bytes / 1048576.0, p.predicted_bytes / 1048576.0,
                  100 * p.memory_error(), p.measured_tokens_per_s, p.predicted_tokens_per_s,
                  has_time ? (std::to_string(static_cast<int>(std::lround(100 * p.time_error()))) + " %").c_str() : "-");
    s << buf;
    memory_ok += std::fabs(p.memory_error()) <= 0.10;
    timed += has_time;
    time_ok += has_time && std::fabs(p.time_error()) <= 0.20;
  }
  s << "\nmemory within 10 %: " << memory_ok << " of " << points.size() << "; step time within 20 %: " << time_ok
    << " of " << timed << "\n";
  return s.str();
}

}  // namespace tandem::plan
