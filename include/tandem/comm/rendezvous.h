#pragma once
// Rendezvous: every rank of a World meets at one c10d store hosted by rank 0.
//
// Note [Rendezvous]
// - Rank 0 hosts a c10d::TCPStore at MASTER_ADDR:MASTER_PORT; the others connect and retry until
//   `timeout`. A world of one uses an in-process HashStore and opens no socket.
// - The store listens on loopback only when every rank is on this host and MASTER_ADDR is a
//   loopback address; a multi-node job listens on every interface, as it must.
// - With a run id (TORCHELASTIC_RUN_ID), rank 0 publishes it and every other rank compares:
//   a worker started for another job is refused instead of joining it.
#include <chrono>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tandem/comm/world.h"

namespace tandem::comm {

constexpr std::chrono::seconds kDefaultRendezvousTimeout{300};

/// Meets the other ranks; throws tandem::Error with a one-line reason on failure.
c10::intrusive_ptr<c10d::Store> rendezvous(const World& world,
                                           std::chrono::milliseconds timeout = kDefaultRendezvousTimeout);

}  // namespace tandem::comm
