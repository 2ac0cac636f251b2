#include "tandem/nn/checkpoint_policy.h"

#include <fnmatch.h>

#include <algorithm>

#include <torch/nn/modules/container/sequential.h>

#include "tandem/error.h"
#include "tandem/nn/checkpoint_module.h"
#include "tandem/nn/hookable.h"

namespace tandem::nn {
namespace {

bool contains_checkpointable(const torch::nn::Module& module) {
  for (const auto& m : module.modules(/*include_self=*/false)) {
    if (dynamic_cast<const Checkpointable*>(m.get())) return true;
  }
  return false;
}

bool has_parameters(const torch::nn::Module& module) { return !module.parameters().empty(); }

// The name patterns' `*`: any run of characters, dots included (fnmatch without FNM_PATHNAME).
bool named(const std::vector<std::string>& patterns, const std::string& path) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return ::fnmatch(p.c_str(), path.c_str(), 0) == 0; });
}

struct Walk {
  const CheckpointPolicy& policy;
  int64_t candidates = 0;
  size_t checkpointed = 0;

  std::string type_of(const torch::nn::Module& module) const {
    if (const auto* self = dynamic_cast<const Checkpointable*>(&module)) return self->wrapped_name();
    if (const auto* hookable = dynamic_cast<const HookableImpl*>(&module)) return hookable->module()->name();
    return module.name();
  }

  // Whether the policy picks `module` at `path` (whether it can reach it is the caller's).
  bool candidate(const torch::nn::Module& module, const std::string& path) const {
    if (dynamic_cast<const CheckpointImpl*>(&module)) return policy.module_names().empty() || named(policy.module_names(), path);
    const auto* self = dynamic_cast<const Checkpointable*>(&module);
    if (!self && contains_checkpointable(module)) return false;
    if (!has_parameters(module)) return false;
    if (!policy.module_names().empty() && !named(policy.module_names(), path)) return false;
    const auto& types = policy.module_types();
    return types.empty() || std::find(types.begin(), types.end(), type_of(module)) != types.end();
  }

  CheckpointOptions options() const { return CheckpointOptions().preserve_rng_state(policy.preserve_rng_state()); }

  // A module that checkpoints itself when asked, wherever it is held; false for any other.
  bool flag(torch::nn::Module& module, bool pick) {
    if (auto* self = dynamic_cast<Checkpointable*>(&module)) {
      if (pick) self->set_activation_checkpointing(true, options());
      checkpointed += self->activation_checkpointing() ? 1 : 0;
      return true;
    }
    if (auto* hookable = dynamic_cast<HookableImpl*>(&module)) {
      if (pick) hookable->set_activation_checkpointing(true, options());
      checkpointed += hookable->activation_checkpointing() ? 1 : 0;
      return true;
    }
    return false;
  }

  // Marks the entries taken as candidates (they are not looked into).
  void sequential(torch::nn::SequentialImpl& seq, const std::string& path, std::vector<bool>& taken) {
    const auto names = seq.named_children().keys();  // in the entries' order
    size_t i = 0;
    for (auto it = seq.begin(); it != seq.end(); ++it, ++i) {
      const auto module = it->ptr();
      if (!candidate(*module, join(path, names.at(i)))) continue;
      taken[i] = true;
      const bool pick = ++candidates % policy.every_n() == 0;
      if (dynamic_cast<CheckpointImpl*>(module.get())) {
        ++checkpointed;
      } else if (!flag(*module, pick) && pick) {
        Checkpoint wrapped(*it, options());
        seq.replace_module(names.at(i), wrapped.ptr());
        *it = torch::nn::AnyModule(wrapped);
        ++checkpointed;
      }
    }
  }

  static std::string join(const std::string& path, const std::string& name) {
    return path.empty() ? name : path + "." + name;
  }

  void visit(torch::nn::Module& module, const std::string& path) {
    auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&module);
    const auto children = module.named_children();
    std::vector<bool> taken(children.size(), false);
    if (seq) sequential(*seq, path, taken);
    for (size_t i = 0; i < children.size(); ++i) {
      // A Sequential's children are its entries, in order.
      if (seq && taken[i]) continue;
      torch::nn::Module& child = *children[i].value();
      const std::string child_path = join(path, children[i].key());
      if (dynamic_cast<CheckpointImpl*>(&child)) continue;
      // Named modules are candidates wherever they are held, if the policy can reach them.
      if (!policy.module_names().empty() && candidate(child, child_path)) {
        const bool pick = (candidates + 1) % policy.every_n() == 0;
        TANDEM_CHECK(flag(child, pick), "activation checkpointing: '", child_path, "' (", type_of(child),
                     ") matches the policy's module_names but is held by '", module.name(), "' as a plain member: "
                     "LibTorch calls its forward with no way to run code around it; hold it in a torch::nn::Sequential, "
                     "or as a tandem::nn::Hookable");
        ++candidates;
        continue;
      }
      visit(child, child_path);
    }
  }
};

}  // namespace

size_t checkpoint_modules(torch::nn::Module& root, const CheckpointPolicy& policy) {
  TANDEM_CHECK(policy.every_n() >= 1, "activation checkpointing: every_n must be 1 or more, got ", policy.every_n());
  Walk walk{policy};
  walk.visit(root, "");
  TANDEM_CHECK(walk.candidates > 0, "activation checkpointing: '", root.name(), "' has no block to checkpoint (",
               policy.module_names().empty() ? "an entry with parameters of a torch::nn::Sequential" :
                                               "a module with parameters named by the policy's module_names",
               policy.module_types().empty() ? "" : " of the policy's module_types",
               "): put the blocks in a Sequential, or wrap them in tandem::nn::Checkpoint yourself");
  return walk.checkpointed;
}

}  // namespace tandem::nn
