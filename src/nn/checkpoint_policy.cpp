#include "tandem/nn/checkpoint_policy.h"

#include <algorithm>

#include <torch/nn/modules/container/sequential.h>

#include "tandem/error.h"
#include "tandem/nn/checkpoint_module.h"

namespace tandem::nn {
namespace {

bool contains_checkpointable(const torch::nn::Module& module) {
  for (const auto& m : module.modules(/*include_self=*/false)) {
    if (dynamic_cast<const Checkpointable*>(m.get())) return true;
  }
  return false;
}

bool has_parameters(const torch::nn::Module& module) { return !module.parameters().empty(); }

struct Walk {
  const CheckpointPolicy& policy;
  int64_t candidates = 0;
  size_t checkpointed = 0;

  bool candidate(const torch::nn::Module& module) const {
    if (dynamic_cast<const CheckpointImpl*>(&module)) return true;
    const auto* self = dynamic_cast<const Checkpointable*>(&module);
    if (!self && contains_checkpointable(module)) return false;
    if (!has_parameters(module)) return false;
    const auto& types = policy.module_types();
    const std::string type = self ? self->wrapped_name() : module.name();
    return types.empty() || std::find(types.begin(), types.end(), type) != types.end();
  }

  // Marks the entries taken as candidates (they are not looked into).
  void sequential(torch::nn::SequentialImpl& seq, std::vector<bool>& taken) {
    const auto names = seq.named_children().keys();  // in the entries' order
    size_t i = 0;
    for (auto it = seq.begin(); it != seq.end(); ++it, ++i) {
      const auto module = it->ptr();
      if (!candidate(*module)) continue;
      taken[i] = true;
      const bool pick = ++candidates % policy.every_n() == 0;
      if (dynamic_cast<CheckpointImpl*>(module.get())) {
        ++checkpointed;
      } else if (auto* self = dynamic_cast<Checkpointable*>(module.get())) {
        if (pick) self->set_activation_checkpointing(true, CheckpointOptions().preserve_rng_state(policy.preserve_rng_state()));
        checkpointed += self->activation_checkpointing() ? 1 : 0;
      } else if (pick) {
        Checkpoint wrapped(*it, CheckpointOptions().preserve_rng_state(policy.preserve_rng_state()));
        seq.replace_module(names.at(i), wrapped.ptr());
        *it = torch::nn::AnyModule(wrapped);
        ++checkpointed;
      }
    }
  }

  void visit(torch::nn::Module& module) {
    std::vector<bool> taken(module.children().size(), false);
    if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&module)) sequential(*seq, taken);
    const auto children = module.children();
    for (size_t i = 0; i < children.size(); ++i) {
      // A Sequential's children are its entries, in order; anything else has no candidates taken.
      if (i < taken.size() && taken[i] && dynamic_cast<torch::nn::SequentialImpl*>(&module)) continue;
      if (dynamic_cast<CheckpointImpl*>(children[i].get())) continue;
      visit(*children[i]);
    }
  }
};

}  // namespace

size_t checkpoint_modules(torch::nn::Module& root, const CheckpointPolicy& policy) {
  TANDEM_CHECK(policy.every_n() >= 1, "activation checkpointing: every_n must be 1 or more, got ", policy.every_n());
  Walk walk{policy};
  walk.visit(root);
  TANDEM_CHECK(walk.candidates > 0, "activation checkpointing: '", root.name(),
               "' has no block to checkpoint (an entry with parameters of a torch::nn::Sequential",
               policy.module_types().empty() ? "" : " of the policy's module_types",
               "): put the blocks in a Sequential, or wrap them in tandem::nn::Checkpoint yourself");
  return walk.checkpointed;
}

}  // namespace tandem::nn
