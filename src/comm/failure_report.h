#pragma once
// Internal: after a collective fails, find out which ranks never reached it.
//
// Note [Naming the missing rank]
// Nothing is recorded while collectives succeed: the fast path pays nothing. When one fails
// (its timeout, or a peer's connection closing), each rank that saw it fail posts the call it
// was in (Note [Collective sequence]) to the rendezvous store and waits a short window for the
// others' posts. A rank that posts nothing never was in a collective that could fail: it is stuck
// elsewhere, it exited, or it arrived more than the window late. A rank that posts another call
// was somewhere else (a different operation, or a call ahead or behind). Both are named.
// The store is asked from a separate thread and the answer is taken after the window plus one
// second whatever happens: a store whose host is stopped (not dead) cannot hold the error back
// for the store's own timeout. What was gathered before a store failure is kept.
#include <chrono>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/collective_call.h"

namespace tandem::comm::detail {

constexpr std::chrono::milliseconds kFailureReportWindow{2000};

/// Posts this rank's failed `call` and returns a sentence about the other ranks ("" when every
/// rank was in the same call). `store_owner` names who hosts the store ("rank 0", "the
/// launcher") for when it cannot be reached. `global_ranks`: a subgroup's members' global ranks,
/// named beside the group's ("rank 1 (global 3)"); empty for the world group. Never throws;
/// returns within `window` + 1 s.
std::string explain_failure(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const CollectiveCall& call,
                            const std::string& store_owner, const std::vector<int>& global_ranks = {},
                            std::chrono::milliseconds window = kFailureReportWindow);

/// "1", "1 and 3", "0, 2 and 3"; with `global_ranks` (a subgroup's): "1 (global 3) and 2 (global 5)".
std::string list_ranks(const std::vector<int>& ranks, const std::vector<int>& global_ranks = {});

}  // namespace tandem::comm::detail
