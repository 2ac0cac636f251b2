#pragma once
// Internal: after a collective fails, find out which ranks never reached it.
//
// Note [Naming the missing rank]
// Nothing is recorded while collectives succeed: the fast path pays nothing. When one fails
// (its timeout, or a peer's connection closing), each rank that saw it fail posts the call it
// was in (Note [Collective sequence]) to the rendezvous store and waits a short window for the
// others' posts. A rank that posts nothing never was in a collective that could fail: it is stuck
// in its own code, or it exited. A rank that posts another call was somewhere else (a different
// operation, or a call ahead or behind). Both are named in the error. Ranks enter a collective
// within moments of each other, so their timeouts expire together and the window is short; a rank
// that arrived more than the window after the others would be named too, and the message says
// "did not report" rather than guessing why.
#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/collective_call.h"

namespace tandem::comm::detail {

constexpr std::chrono::milliseconds kFailureReportWindow{2000};

/// Posts this rank's failed `call` and returns a sentence about the other ranks ("" when every
/// rank was in the same call). Never throws: a store that cannot be reached is said so.
std::string explain_failure(c10d::Store& store, int rank, int size, const CollectiveCall& call,
                            std::chrono::milliseconds window = kFailureReportWindow);

/// "1", "1 and 3", "0, 2 and 3".
std::string list_ranks(const std::vector<int>& ranks);

}  // namespace tandem::comm::detail
