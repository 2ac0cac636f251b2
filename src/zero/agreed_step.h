#pragma once
#include <functional>

#include "tandem/comm/process_group.h"

namespace tandem::zero {

/// Runs `step` (true: stepped, false: skipped) and makes every rank agree: the outcome is
/// all-reduced, and a step that threw or disagreed on any rank throws tandem::Error on every rank.
/// Returns whether every rank stepped. Collective.
bool agreed_step(comm::ProcessGroup& pg, const std::function<bool()>& step);

}  // namespace tandem::zero
