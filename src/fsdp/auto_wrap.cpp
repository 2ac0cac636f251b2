#include "tandem/fsdp/auto_wrap.h"

#include <algorithm>

#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/fsdp/unit.h"

namespace tandem::fsdp {
namespace {

bool picked(const torch::nn::Module& module, const AutoWrapPolicy& policy) {
  if (dynamic_cast<const UnitImpl*>(&module)) return false;
  int64_t numel = 0;
  for (const auto& p : module.parameters()) numel += p.numel();
  if (numel == 0 || numel < policy.min_params()) return false;
  const auto& types = policy.module_types();
  return types.empty() || std::find(types.begin(), types.end(), module.name()) != types.end();
}

}  // namespace

size_t wrap_entries(torch::nn::SequentialImpl& sequential, const AutoWrapPolicy& policy) {
  const auto names = sequential.named_children().keys();  // in the entries' order
  size_t made = 0, i = 0;
  for (auto it = sequential.begin(); it != sequential.end(); ++it, ++i) {
    if (!picked(*it->ptr(), policy)) continue;
    Unit unit(*it);
    sequential.replace_module(names.at(i), unit.ptr());
    *it = torch::nn::AnyModule(unit);
    ++made;
  }
  return made;
}

size_t auto_wrap(torch::nn::Module& root, const AutoWrapPolicy& policy) {
  size_t made = 0;
  if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&root)) made += wrap_entries(*sequential, policy);
  for (const auto& child : root.children()) {
    if (!dynamic_cast<UnitImpl*>(child.get())) made += auto_wrap(*child, policy);
  }
  return made;
}

bool has_units(torch::nn::Module& root) {
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (dynamic_cast<UnitImpl*>(m.get())) return true;
  }
  return false;
}

}  // namespace tandem::fsdp
