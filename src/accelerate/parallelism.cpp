#include "tandem/accelerate/parallelism.h"

#include "tandem/accelerate/options.h"
#include "tandem/error.h"

namespace tandem {

bool ParallelismPlan::hybrid() const { return strategy == Strategy::Fsdp && replicate > 1; }

std::string ParallelismPlan::describe() const {
  std::string text;
  auto add = [&](const char* name, int size) {
    if (size > 1) text += (text.empty() ? "" : " x ") + std::string(name) + " " + std::to_string(size);
  };
  add("pp", pp);
  add("replicate", replicate);
  add("shard", shard);
  add("tp", tp);
  return text.empty() ? "1" : text;
}

// Note [Parallelism plan]
// The mesh is ("pp", "replicate", "shard", "tp"), row-major, tensor parallelism fastest (its
// ranks are neighbours, on one host), as torchtitan orders it. Sizes left at 0 take what the
// others leave: shard under Fsdp, replicate otherwise, so that an unset config means what the
// strategy always meant (DDP replicates over every process, FSDP shards over every process).
ParallelismPlan plan_parallelism(const ParallelismConfig& config, Strategy asked, int processes) {
  TANDEM_CHECK(config.replicate_size() >= 0, "parallelism: replicate_size ", config.replicate_size(),
               " must be at least 0 (0: what the other sizes leave)");
  TANDEM_CHECK(config.shard_size() >= 0, "parallelism: shard_size ", config.shard_size(),
               " must be at least 0 (0: what the other sizes leave under Strategy::Fsdp, else 1)");
  TANDEM_CHECK(config.tp_size() >= 1, "parallelism: tp_size ", config.tp_size(), " must be at least 1");
  TANDEM_CHECK(config.pp_size() >= 1, "parallelism: pp_size ", config.pp_size(), " must be at least 1");
  ParallelismPlan plan;
  plan.strategy = asked;
  plan.tp = config.tp_size();
  plan.pp = config.pp_size();
  TANDEM_CHECK(plan.tp == 1 || asked == Strategy::Auto || asked == Strategy::Ddp || asked == Strategy::Fsdp,
               "parallelism: tp_size ", plan.tp, " with Strategy::", to_string(asked),
               ": tensor parallelism runs one process per piece of each layer; use Strategy::Ddp or Fsdp (or Auto) "
               "for the other dimensions");
  TANDEM_CHECK(plan.pp == 1 || asked == Strategy::Auto || asked == Strategy::Ddp || asked == Strategy::Fsdp,
               "parallelism: pp_size ", plan.pp, " with Strategy::", to_string(asked),
               ": pipeline stages run one process each; use Strategy::Ddp or Fsdp (or Auto) for the other dimensions");
  TANDEM_CHECK(plan.pp == 1 || plan.tp == 1, "parallelism: tp_size ", plan.tp, " with pp_size ", plan.pp,
               ": tensor parallelism inside pipeline stages is not built yet; use one of the two");
  const bool shards = config.shard_size() > 1 || (config.shard_size() == 0 && asked == Strategy::Fsdp);
  if (asked == Strategy::Auto && config.shard_size() > 1) plan.strategy = Strategy::Fsdp;
  TANDEM_CHECK(!shards || plan.strategy == Strategy::Fsdp, "parallelism: shard_size ", config.shard_size(),
               " shards the parameters, which Strategy::", to_string(asked),
               " does not: use Strategy::Fsdp (or Auto), or shard_size 1");
  const int fixed = plan.tp * plan.pp * std::max(1, config.shard_size()) * std::max(1, config.replicate_size());
  auto sizes = [&](int r, int s) {
    return std::to_string(r) + " x " + std::to_string(s) + " x " + std::to_string(plan.tp) + " x " +
           std::to_string(plan.pp);
  };
  const bool open = config.replicate_size() == 0 || config.shard_size() == 0;
  TANDEM_CHECK(processes % fixed == 0 && (open || fixed == processes), "parallelism: replicate_size x shard_size x ",
               "tp_size x pp_size = ", sizes(config.replicate_size(), config.shard_size()),
               open ? " does not divide the " : " is not the ", processes, " process", processes == 1 ? "" : "es",
               " launched: the sizes must multiply to the number of processes");
  const int rest = processes / fixed;
  plan.replicate = std::max(1, config.replicate_size());
  plan.shard = std::max(1, config.shard_size());
  if (config.shard_size() == 0 && plan.strategy == Strategy::Fsdp) {
    plan.shard *= rest;
  } else if (config.replicate_size() == 0) {
    plan.replicate *= rest;
  } else if (config.shard_size() == 0) {
    TANDEM_CHECK(rest == 1, "parallelism: replicate_size x shard_size x tp_size x pp_size = ",
                 sizes(config.replicate_size(), 1), " is not the ", processes,
                 " processes launched: the sizes must multiply to the number of processes");
  }
  return plan;
}

}  // namespace tandem
