#pragma once
// One style of a plan applied to one module (styles.cpp): its parameters cut, its hooks set.
#include <map>
#include <memory>
#include <set>
#include <string>

#include "conversions.h"
#include "tandem/nn/hookable.h"
#include "tandem/tp/style.h"

namespace tandem::tp::detail {

/// A module's type as users write it: "torch::nn::Linear" for LinearImpl.
std::string type_of(const torch::nn::Module& module);

/// Cuts `module`'s parameters for `style` in place and installs its hooks; `name` is its name in
/// the model (for errors). Returns the placements of the parameters it cut, by their names in
/// `module` ("weight"). `checking`: only the errors, nothing changed (Note [Checked before cut]);
/// `already_cut` gathers the tensors cut (a tied weight is cut once).
std::map<std::string, Placement> apply_style(const Style& style, nn::HookableImpl& module, const std::string& name,
                                             const std::shared_ptr<Conversions>& conversions, bool checking,
                                             std::set<c10::TensorImpl*>& already_cut);

}  // namespace tandem::tp::detail
