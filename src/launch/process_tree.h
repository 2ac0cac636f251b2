#pragma once
// The processes below this one, read from /proc: what `tandem run --backend mpi` must stop.
// mpirun puts every rank in a process group of its own (signalling mpirun's group misses them),
// and a rank whose mpirun died is re-parented, so the launcher makes itself a child subreaper
// (PR_SET_CHILD_SUBREAPER): orphans of its tree become its children, never init's, and stay
// findable here until it kills and reaps them.
#include <sys/types.h>

#include <vector>

namespace tandem::launch {

/// Makes this process a child subreaper. Throws tandem::Error when the kernel refuses.
void become_subreaper();

/// Every live (not zombie) process whose chain of parents leads to `root` (root excluded),
/// parents first.
std::vector<pid_t> descendants_of(pid_t root);

/// The live children of `root`, e.g. mpirun's local ranks.
std::vector<pid_t> children_of(pid_t root);

/// Reaps every zombie child of this process except `keep` (mpirun, reaped by its owner).
void reap_children_except(pid_t keep);

/// SIGKILLs every live descendant of this process (`keep` too, if alive) and reaps them all but
/// `keep`; repeats until none is alive (a process may fork while this runs), `limit_ms` at most.
/// Returns how many processes other than `keep` it signalled.
int kill_descendants_except(pid_t keep, int limit_ms = 2000);

}  // namespace tandem::launch
