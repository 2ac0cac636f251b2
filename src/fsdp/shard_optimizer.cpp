#include <unordered_map>

#include "tandem/error.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"

namespace tandem::fsdp {

void shard_optimizer(torch::optim::Optimizer& optimizer, const detail::Engine& engine) {
  TANDEM_CHECK(optimizer.state().empty(), "fsdp: shard the optimizer before its first step (it holds state already)");
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor shard = engine.shard_of(p);
      TANDEM_CHECK(shard.defined(), "fsdp: the optimizer holds a tensor of shape ", p.sizes(),
                   " that is no parameter of the sharded model");
      p = shard;
    }
  }
}

}  // namespace tandem::fsdp
