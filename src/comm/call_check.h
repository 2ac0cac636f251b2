#pragma once
// Internal: the collective debug mode's check (TANDEM_DEBUG=DETAIL, tandem/comm/debug.h).
#include <chrono>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "comm/collective_call.h"

namespace tandem::comm::detail {

/// Every rank all-gathers its `call` over `backend` (the CPU one) before issuing it. Throws
/// tandem::Error naming every side when the calls differ ("collective #7 differs across ranks: rank 0 calls ...; rank 1
/// calls ..."); lets the all-gather's own failure (a timeout) through as it came.
void check_same_call(c10d::Backend& backend, const CollectiveCall& call, int size, std::chrono::milliseconds timeout);

}  // namespace tandem::comm::detail
