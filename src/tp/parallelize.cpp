#include "tandem/tp/parallelize.h"

#include <fnmatch.h>

#include <set>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>

#include "apply_style.h"
#include "conversions.h"
#include "tandem/comm/agreement.h"
#include "tandem/error.h"
#include "tandem/nn/hookable.h"

namespace tandem::tp {
namespace {

std::vector<std::string> split_dots(const std::string& name) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(name);
  while (std::getline(in, part, '.')) parts.push_back(part);
  return parts;
}

// parallelize_module's rule: as many parts as the name, each matched by its glob.
bool matches(const std::string& pattern, const std::string& name) {
  const auto globs = split_dots(pattern), parts = split_dots(name);
  if (globs.size() != parts.size()) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (fnmatch(globs[i].c_str(), parts[i].c_str(), 0) != 0) return false;
  }
  return true;
}

// Rank 0's parameters and buffers on every rank of the group: the pieces each rank keeps are
// then pieces of one model.
void sync_from_first(torch::nn::Module& module, comm::ProcessGroup& group) {
  if (group.size() == 1) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  for (const auto& p : module.parameters()) tensors.push_back(p.detach());
  for (const auto& b : module.buffers()) tensors.push_back(b.detach());
  if (!tensors.empty()) group.broadcast_coalesced(tensors, 0);
}

// The Hookable a matched module is, or wraps (an fsdp::Unit or nn::Checkpoint of one).
nn::HookableImpl* hookable_in(torch::nn::Module* module) {
  while (module) {
    if (auto* hookable = dynamic_cast<nn::HookableImpl*>(module)) return hookable;
    auto* wrapper = dynamic_cast<nn::Wrapper*>(module);
    module = wrapper ? wrapper->module().get() : nullptr;
  }
  return nullptr;
}

}  // namespace

std::string style_name(const Style& style) {
  static const char* names[] = {"ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
                                "PrepareModuleOutput"};
  return names[style.index()];
}

Placement Layout::placement(const std::string& name) const {
  auto it = placements.find(name);
  return it == placements.end() ? Placement::replicate() : it->second;
}

Layout parallelize(torch::nn::Module& module, Group group, const Plan& plan) {
  TANDEM_CHECK(group, "tp: parallelize needs a process group");
  const auto modules = module.named_modules("", /*include_self=*/false);
  // Note [Agreement before waiting] (docs/design/comm.md): one plan, one model, on every rank of
  // the group, before the checks below (which must fail on every rank or none) and any collective.
  std::string entries;
  for (const auto& [pattern, style] : plan) entries += (entries.empty() ? "" : ", ") + pattern + ": " + style_name(style);
  int64_t tensors = 0, values = 0;
  for (const auto& p : module.parameters()) {
    ++tensors;
    values += p.numel();
  }
  comm::Agreement("tp: the plan")
      .field("plan", entries.empty() ? "(empty)" : entries)
      .field("model", std::to_string(modules.size()) + " modules, " + std::to_string(tensors) + " parameters of " +
                          std::to_string(values) + " values")
      .check(*group);
  TANDEM_CHECK(!plan.empty(), "tp: an empty plan");
  // Each plan entry's modules, checked before anything is cut.
  struct Target {
    std::string name;
    const Style* style;
    nn::HookableImpl* hookable;
  };
  std::vector<Target> targets;
  std::map<std::string, std::string> matched_by;
  for (const auto& [pattern, style] : plan) {
    size_t found = 0;
    for (const auto& item : modules) {
      if (!matches(pattern, item.key())) continue;
      ++found;
      const std::string& name = item.key();
      auto [it, fresh] = matched_by.emplace(name, pattern);
      TANDEM_CHECK(fresh, "tp: '", name, "' is matched by both '", it->second, "' and '", pattern,
                   "' in the plan: give each module one style");
      auto* hookable = hookable_in(item.value().get());
      TANDEM_CHECK(hookable, "tp: '", name, "' (", detail::type_of(*item.value()),
                   ") is not a tandem::nn::Hookable: declare it as tandem::nn::Hookable(...) (inside a Unit or "
                   "Checkpoint if it has one) so that the plan can run its collectives around its forward");
      TANDEM_CHECK(!hookable->has_hooks(), "tp: '", name, "' has forward hooks already (parallelized twice?)");
      targets.push_back({name, &style, hookable});
    }
    if (found == 0) {
      std::string examples;
      for (size_t i = 0; i < modules.size() && i < 4; ++i) examples += (i ? ", '" : "'") + modules[i].key() + "'";
      TANDEM_CHECK(false, "tp: the plan's '", pattern, "' matches no module of ", detail::type_of(module),
                   modules.is_empty() ? std::string(" (it has no submodules)") : " (its modules: " + examples + ", ...)");
    }
  }

  Layout layout{group, {}};
  auto conversions = std::make_shared<detail::Conversions>(group);
  for (const bool checking : {true, false}) {  // Note [Checked before cut] in styles.cpp
    if (!checking) sync_from_first(module, *group);
    std::set<c10::TensorImpl*> cut;
    for (const auto& t : targets) {
      const auto placements = detail::apply_style(*t.style, *t.hookable, t.name, conversions, checking, cut);
      if (checking) continue;
      for (const auto& [param, placement] : placements) layout.placements[t.name + "." + param] = placement;
    }
  }
  return layout;
}

Layout parallelize(torch::nn::Module& module, const comm::DeviceMesh& tp_mesh, const Plan& plan) {
  TANDEM_CHECK(tp_mesh.ndim() == 1, "tp: parallelize takes a 1-D mesh (mesh[\"tp\"]), not ", tp_mesh.describe());
  return parallelize(module, tp_mesh.group(), plan);
}

}  // namespace tandem::tp
