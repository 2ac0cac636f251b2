#include <unordered_map>

#include "tandem/error.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/zero/param_state.h"

namespace tandem::fsdp {

void shard_optimizer(torch::optim::Optimizer& optimizer, const ShardedParameters& engine) {
  const zero::OptimizerKind kind = zero::kind_of(optimizer);
  // Adagrad makes its state when it is made (step 0): the whole parameters', made again below for
  // the shards. Any other state is a step taken already.
  for (const auto& item : optimizer.state()) {
    TANDEM_CHECK(zero::is_initial_state(kind, *item.second),
                 "fsdp: shard the optimizer before its first step (it holds state already)");
  }
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor shard = engine.shard_of(p);
      TANDEM_CHECK(shard.defined(), "fsdp: the optimizer holds a tensor of shape ", p.sizes(),
                   " that is no parameter of the sharded model");
      p = shard;
    }
  }
  optimizer.state().clear();
  for (auto& group : optimizer.param_groups()) {
    for (const auto& shard : group.params()) {
      if (auto initial = zero::initial_state(kind, group.options(), shard)) {
        optimizer.state()[shard.unsafeGetTensorImpl()] = std::move(initial);
      }
    }
  }
}

}  // namespace tandem::fsdp
