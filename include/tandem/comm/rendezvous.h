#pragma once
// Rendezvous: every rank of a World meets at one c10d store, hosted by rank 0 or by the launcher.
//
// Note [Rendezvous]
// - Rank 0 hosts a c10d::TCPStore at MASTER_ADDR:MASTER_PORT; the others connect and retry until
//   `timeout`. A world of one uses an in-process HashStore and opens no socket.
// - Note [Agent store]: with TORCHELASTIC_USE_AGENT_STORE=True (World::use_agent_store; torchrun
//   sets it) the launcher already serves the store there, and every rank, rank 0 included,
//   connects as a client. That store outlives the workers, so each attempt works under its own
//   prefix, agent_store_prefix(TORCHELASTIC_RESTART_COUNT): a restarted attempt never reads the
//   keys of the attempt before it. The prefix is the one PyTorch's `_create_c10d_store` used
//   (`/worker/attempt_<N>`); PyTorch 2.11's own workers use none.
// - The store listens on loopback only when every rank is on this host and MASTER_ADDR is a
//   loopback address; a multi-node job listens on every interface, as it must.
// - Rank 0 publishes its run id (TORCHELASTIC_RUN_ID, empty when unset) and every other rank
//   compares: a worker started for another job, or without the job's id, is refused instead of
//   joining it.
#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tandem/comm/world.h"

namespace tandem::comm {

constexpr std::chrono::seconds kDefaultRendezvousTimeout{300};

/// The key prefix of one attempt in a launcher's store: "/worker/attempt_<restart_count>".
std::string agent_store_prefix(int restart_count);

/// Meets the other ranks; throws tandem::Error with a one-line reason on failure.
c10::intrusive_ptr<c10d::Store> rendezvous(const World& world,
                                           std::chrono::milliseconds timeout = kDefaultRendezvousTimeout);

}  // namespace tandem::comm
