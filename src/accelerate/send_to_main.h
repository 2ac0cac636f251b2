#pragma once
// send_to_main and broadcast_from_main: bytes between every rank and the main process, in pieces
// the MPI backend can move (checkpoints, get_state_dict).
#include <functional>
#include <memory>
#include <string>

#include "tandem/comm/process_group.h"

namespace tandem::accelerate {

// Every rank's bytes (`build()`) to the main process, one rank after another, in pieces of 64 MiB
// (the MPI backend moves at most 128 MiB per rank at once), sent to it alone (point-to-point: a
// broadcast made every rank receive every other's pieces, W - 1 times the traffic): the main
// process calls `consume(r, bytes)` for each rank r in order and holds only its own bytes and one
// other rank's at a time, so a sharded checkpoint is never whole in one process. The ranks first
// agree that every one of them built its bytes: one that failed (out of memory) makes every rank
// throw instead of leaving the others waiting. Collective.
// `what` leads the one-line errors ("save_state").
void send_to_main(const std::shared_ptr<comm::ProcessGroup>& pg, const std::string& what,
                  const std::function<std::string()>& build, const std::function<void(int, std::string)>& consume);

/// The main process's `bytes` on every process (the others' are ignored), broadcast in the same
/// pieces. Collective.
std::string broadcast_from_main(comm::ProcessGroup& pg, std::string bytes);

}  // namespace tandem::accelerate
