#include "plan/search.h"

#include <algorithm>
#include <cstdio>

#include "tandem/error.h"

namespace tandem::plan {

// Note [Search]
// The devices are dp x tp x pp (Note [Configurations]). Tensor parallelism stays inside a node
// and must divide the heads, the key/value heads, the FFN, the vocabulary (Tandem's plan cuts the
// embedding and the head too) and a node's devices; a pipeline has at least one block per stage.
// What Tandem's Accelerator refuses is refused here with its reason: ZeRO over pipeline stages or
// tensor-parallel pieces, fewer microbatches than stages. The global batch is fixed: each data-parallel rank trains
// batch / dp sequences per step in `microbatches` pieces (gradient accumulation without a
// pipeline). A configuration fits when its peak (Note [Peak memory]) is at most a device's memory.

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

void check_job(const Job& job) {
  check_model(job.model);
  TANDEM_CHECK(job.global_batch > 0 && job.global_batch <= (int64_t{1} << 40), "--batch must be between 1 and 2^40 (got ",
               job.global_batch, ")");
  const double rate = job.precision == "fp32" ? job.profile.fp32_flops : job.profile.bf16_flops;
  state_bytes(job.precision, job.optimizer);  // checks both
  TANDEM_CHECK(rate > 0, "profile ", job.profile.name, " has no ", job.precision, " rate (use --precision ",
               job.precision == "fp32" ? "bf16" : "fp32", ", or set flops.", job.precision, " in a profile file)");
}

std::string refusal_of(const Job& job, const Configuration& c) {
  const Model& m = job.model;
  const Profile& p = job.profile;
  if (c.dp * c.tp * c.pp != p.devices()) {
    return "dp " + std::to_string(c.dp) + " x tp " + std::to_string(c.tp) + " x pp " + std::to_string(c.pp) +
           " is not the " + std::to_string(p.devices()) + " devices";
  }
  if (c.tp > p.devices_per_node) return "tensor parallelism across nodes is not planned (tp > devices per node)";
  if (p.devices_per_node % c.tp) {
    return "tp " + std::to_string(c.tp) + " does not divide the " + std::to_string(p.devices_per_node) +
           " devices of a node (a group would straddle two)";
  }
  if (m.heads % c.tp || m.kv_heads % c.tp || m.ffn % c.tp || m.vocab % c.tp) {
    return "tp " + std::to_string(c.tp) + " does not divide the heads, key/value heads, FFN and vocabulary";
  }
  if (c.pp > m.layers) return "pp " + std::to_string(c.pp) + " is more stages than the " + std::to_string(m.layers) + " blocks";
  if (c.pp > 1 && (c.sharding == "zero1" || c.sharding == "zero2")) {
    return c.sharding + " over pipeline stages is not built (the Accelerator refuses it)";
  }
  if (c.tp > 1 && (c.sharding == "zero1" || c.sharding == "zero2")) {
    return c.sharding + " over tensor-parallel pieces is not built (the Accelerator refuses it)";
  }
  if (c.sharding == "hsdp" && (c.shard <= 1 || c.shard >= c.dp || c.dp % c.shard)) {
    return "hsdp needs a shard group that divides dp and is between 1 and dp";
  }
  if (job.global_batch % c.dp) {
    return "the batch of " + std::to_string(job.global_batch) + " sequences does not divide over dp " + std::to_string(c.dp);
  }
  if (c.local_batch % c.microbatches) {
    return std::to_string(c.local_batch) + " sequences per rank do not divide into " + std::to_string(c.microbatches) +
           " microbatches";
  }
  if (c.pp > 1 && c.microbatches < c.pp) {
    return std::to_string(c.microbatches) + " microbatches are fewer than the " + std::to_string(c.pp) + " stages";
  }
  return "";
}

Estimate estimate(const Job& job, const Configuration& config) {
  Estimate e;
  e.config = config;
  e.refusal = refusal_of(job, config);
  if (!e.refusal.empty()) {
    e.buildable = false;
    return e;
  }
  e.memory = peak_memory(job, config);
  e.time = step_time(job, config);
  e.tokens_per_s_per_device = static_cast<double>(job.global_batch) * static_cast<double>(job.model.seq) /
                              e.time.step() / job.profile.devices();
  const double available = static_cast<double>(job.profile.memory_bytes);
  if (e.memory.total() > available) {
    e.refusal = "needs " + gib(e.memory.total()) + " per device, has " + gib(available);
  }
  return e;
}

std::vector<Estimate> plan_all(const Job& job, const SearchSpace& sizes) {
  check_job(job);
  const int devices = job.profile.devices();
  TANDEM_CHECK(sizes.dp >= 0 && sizes.tp >= 0 && sizes.pp >= 0, "--dp, --tp and --pp must be positive");
  const int given = std::max(1, sizes.dp) * std::max(1, sizes.tp) * std::max(1, sizes.pp);
  TANDEM_CHECK(devices % given == 0 && (!(sizes.dp && sizes.tp && sizes.pp) || given == devices), "--dp ",
               sizes.dp ? std::to_string(sizes.dp) : "any", " x --tp ", sizes.tp ? std::to_string(sizes.tp) : "any",
               " x --pp ", sizes.pp ? std::to_string(sizes.pp) : "any", " cannot make the ", devices, " devices of ",
               job.profile.name, " (", job.profile.nodes, " x ", job.profile.devices_per_node, ")");
  std::vector<Estimate> out;
  for (int tp : divisors(devices)) {
    for (int pp : divisors(devices / tp)) {
      const int dp = devices / tp / pp;
      if ((sizes.tp && tp != sizes.tp) || (sizes.pp && pp != sizes.pp) || (sizes.dp && dp != sizes.dp)) continue;
      std::vector<std::pair<std::string, int>> shardings{{"ddp", 1}};
      if (dp > 1) {
        for (const char* s : {"zero1", "zero2", "fsdp"}) shardings.emplace_back(s, dp);
        for (int shard : divisors(dp)) {
          if (shard > 1 && shard < dp) shardings.emplace_back("hsdp", shard);
        }
      }
      const int64_t local = job.global_batch % dp ? 0 : job.global_batch / dp;
      for (const auto& [sharding, shard] : shardings) {
        for (Checkpointing checkpointing : sizes.checkpointing) {
          for (int64_t m = 1; m <= std::max<int64_t>(1, local) && m <= (int64_t{1} << 20); m *= 2) {
            Configuration c;
            c.sharding = sharding;
            c.dp = dp, c.shard = shard, c.tp = tp, c.pp = pp;
            c.checkpointing = checkpointing;
            c.sequence_parallel = tp > 1 && sizes.sequence_parallel;
            c.microbatches = static_cast<int>(m);
            c.local_batch = local;
            Estimate e = estimate(job, c);
            // Refusals that hold for every microbatch count are reported once, at m = 1.
            if (!e.buildable && m > 1 && refusal_of(job, Configuration{c.sharding, c.dp, c.shard, c.tp, c.pp, c.checkpointing,
                                                                       c.sequence_parallel, 1, c.local_batch}) == e.refusal) {
              continue;
            }
            out.push_back(std::move(e));
          }
        }
      }
    }
  }
  const bool any_built = std::any_of(out.begin(), out.end(), [](const Estimate& e) { return e.buildable; });
  TANDEM_CHECK(any_built || out.empty(), "no configuration can be built: ", out.empty() ? "" : out.front().refusal);
  TANDEM_CHECK(!out.empty(), "no configuration has --dp x --tp x --pp = ", devices, " devices");
  std::stable_sort(out.begin(), out.end(), [](const Estimate& a, const Estimate& b) {
    if (a.fits() != b.fits()) return a.fits();
    if (a.buildable != b.buildable) return a.buildable;
    if (a.fits()) return a.time.step() < b.time.step();
    return a.memory.total() < b.memory.total();
  });
  return out;
}

}  // namespace tandem::plan
