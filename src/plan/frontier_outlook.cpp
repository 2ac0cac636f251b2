#include "plan/frontier_outlook.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "plan/search.h"
#include "plan/validate.h"

namespace tandem::plan {

// Note [Outlook]
// The frontier measures what runs here; the plan answers for what does not. The report gives the
// plan's error on this run's own probes first (so a reader knows how far to trust the rest),
// then, for each member of the family larger than every strategy's largest fit, the fastest
// configuration the plan predicts to fit the same budget on the same processes: its layout, peak
// and tokens/s, marked predicted. Only layouts this run validated compete: a strategy whose every
// probe from member 2 on came within 10 % of the plan (smaller members are mostly the runtime's
// noise), at one microbatch and no pipeline, as the probes ran; the others are named with their
// worst error. The "cpu" profile is the one `tandem plan --profile cpu` uses, with the run's
// process count and budget.

namespace {

// What a frontier strategy validates: its sharding (HSDP counts as FSDP), checkpointing, whether TP.
std::string kind_of(const std::string& sharding, bool checkpointing, bool tp) {
  return (sharding == "hsdp" ? std::string("fsdp") : sharding) + (checkpointing ? "+ckpt" : "") + (tp ? "+tp" : "");
}

std::string kind_of_frontier(const std::string& strategy, int world) {
  const Configuration c = frontier_configuration(strategy, world, 1);
  return kind_of(c.sharding, c.checkpointing == Checkpointing::Full, c.tp > 1);
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

namespace {
std::string outlook(const nlohmann::json& results);
}  // namespace

std::string frontier_outlook(const nlohmann::json& results) {
  try {
    return outlook(results);
  } catch (const std::exception&) {
    return "";  // a results.json the plan cannot read: the report goes without its outlook
  }
}

namespace {

std::string outlook(const nlohmann::json& results) {
  if (!results.is_object() || results.value("scale", std::string()) != "cpu") return "";
  Profile cpu = load_profile("cpu");
  const int world = results.value("world", 0);
  const double budget = results.value("budget_bytes", 0.0);
  if (world < 1 || budget <= static_cast<double>(cpu.runtime_bytes)) return "";
  std::vector<ValidationPoint> points;
  try {
    points = validate_frontier(results, cpu);
  } catch (const std::exception&) {
    return "";  // a strategy the plan does not model: no outlook rather than a wrong one
  }
  if (points.empty()) return "";
  std::ostringstream md;
  int within = 0;
  double worst = 0;
  for (const auto& p : points) {
    within += std::fabs(p.memory_error()) <= 0.10;
    worst = std::max(worst, std::fabs(p.memory_error()));
  }
  md << "\n## The plan beside the measurement\n\n"
     << "`tandem plan --profile cpu` (docs/guide-plan.md) predicted every probe that fit: " << within << " of "
     << points.size() << " peaks within 10 % of the cgroup's (the worst off by " << std::lround(100 * worst)
     << " %); `tandem plan --profile cpu --validate DIR` prints each.\n";

  std::map<std::string, double> worst_of;  // frontier strategy -> its worst error from member 2 on
  for (const auto& p : points) {
    if (p.model == "gpt-cpu-0" || p.model == "gpt-cpu-1") continue;
    worst_of[p.strategy] = std::max(worst_of[p.strategy], std::fabs(p.memory_error()));
  }
  std::set<std::string> validated;
  std::string left_out;
  for (const auto& [strategy, error] : worst_of) {
    if (error <= 0.10) {
      validated.insert(kind_of_frontier(strategy, world));
    } else {
      left_out += (left_out.empty() ? "" : ", ") + strategy + " (up to " + std::to_string(std::lround(100 * error)) + " %)";
    }
  }
  int largest = -1;
  for (const auto& row : results.at("rows")) {
    if (row.value("impl", std::string()) == "tandem" && !row.at("largest").is_null()) {
      largest = std::max(largest, row.at("largest").value("index", -1));
    }
  }
  const int size = static_cast<int>(results.at("family").size());
  if (largest + 1 >= size || validated.empty()) return md.str();
  md << "\nPredicted, not measured: the members no strategy fitted, and the fastest layout the plan expects to fit "
     << mib(budget) << " on " << world << " processes (fp32, Adam, the family's batch per process), among the "
     << "strategies whose probes here the plan predicted within 10 %"
     << (left_out.empty() ? "" : "; left out, measured further from the plan: " + left_out) << ":\n\n"
     << "| member | params | planned layout | planned peak | planned tokens/s |\n|---:|---:|---|---:|---:|\n";
  cpu.devices_per_node = world;
  cpu.memory_bytes = static_cast<int64_t>(budget);
  for (int index = largest + 1; index < size; ++index) {
    Job job;
    job.model = frontier_family_model("cpu", index);
    job.precision = "fp32";
    job.profile = cpu;
    job.global_batch = results.at("family").at(index).value("batch", 4) * world;
    std::vector<Estimate> plans;
    SearchSpace space;
    space.sequence_parallel = false;  // as bench::gpt_tp_plan() cuts the model: the layouts validated
    for (auto& e : plan_all(job, space)) {
      const Configuration& c = e.config;
      if (c.pp == 1 && c.microbatches == 1 && validated.count(kind_of(c.sharding, c.checkpointing == Checkpointing::Full, c.tp > 1)) &&
          c.checkpointing != Checkpointing::Selective) {
        plans.push_back(std::move(e));
      }
    }
    char params[32];
    std::snprintf(params, sizeof(params), "%.2f M", static_cast<double>(job.model.params()) / 1e6);
    md << "| " << index << " | " << params << " | ";
    if (plans.empty() || !plans.front().fits()) {
      md << "none fits | | |\n";
      continue;
    }
    const Estimate& best = plans.front();
    char tps[32];
    std::snprintf(tps, sizeof(tps), "%.0f", best.tokens_per_s_per_device * world);
    md << best.config.name() << " | " << mib(best.memory.total()) << " | " << tps << " |\n";
  }
  return md.str();
}

}  // namespace

}  // namespace tandem::plan
