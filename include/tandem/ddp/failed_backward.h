#pragma once
// The agreement after a backward that raised (Note [Failed backward] in
// include/tandem/ddp/reducer.h), shared by DDP's reducer and FSDP's engine.
#include <string>
#include <vector>

#include "tandem/comm/process_group.h"

namespace tandem::ddp {

/// Posts `mine` (what this rank's failed backward launched) under `prefix` in the group's store
/// and returns every rank's post, by rank. Throws tandem::Error, starting with `who`, naming the
/// ranks that posted nothing within the collective timeout: their backward did not fail.
std::vector<std::string> exchange_after_failed_backward(comm::ProcessGroup& pg, const std::string& prefix,
                                                        const std::string& mine, const std::string& who);

}  // namespace tandem::ddp
