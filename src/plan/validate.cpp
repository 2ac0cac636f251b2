#include "plan/validate.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "bench/frontier.h"
#include "plan/search.h"
#include "tandem/error.h"

namespace tandem::plan {

namespace {

// The frontier worker's layout of each strategy (bench/frontier_worker.cpp): every process a
// data-parallel rank, except tp (one group of all) and fsdp+tp (pairs).
Configuration frontier_configuration(const std::string& strategy, int world, int64_t batch) {
  Configuration c;
  const int tp = strategy == "tp" ? world : strategy == "fsdp+tp" ? 2 : 1;
  c.tp = tp;
  c.dp = world / tp;
  c.local_batch = batch * tp;  // a TP group trains batch x its size sequences
  c.checkpointing = strategy == "fsdp-checkpoint" || strategy == "ddp-checkpoint";
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

}  // namespace

std::vector<ValidationPoint> validate_frontier(const nlohmann::json& results, const Profile& cpu) {
  TANDEM_CHECK(results.is_object() && results.value("kind", std::string()) == "memory-frontier" && results.contains("rows"),
               "not the results.json of a tandem bench --memory-budget run");
  const int world = results.at("world").get<int>();
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
