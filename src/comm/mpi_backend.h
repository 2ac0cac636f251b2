#pragma once
// Internal: a c10d::Backend over Open MPI for CPU tensors, the shared-memory fast path Gloo
// lacks (docs/design/mpi.md). PyTorch's own ProcessGroupMPI is not in the pip wheel; this one is
// ours, on the same c10d interface, so ProcessGroup and DDP use it exactly as they use Gloo.
//
// Every call runs on the process's MPI engine thread (mpi_engine.h) in issue order, on the
// backend's own communicator (a duplicate of MPI_COMM_WORLD). Work::wait(timeout) is the
// collective timeout: MPI cannot cancel a collective, so one that times out leaves the engine
// stuck, later calls fail at once, and the process should exit non-zero (mpirun then ends the job).
#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace tandem::comm::detail {

/// Whether this build of Tandem has the MPI backend (Open MPI's development files were found).
bool mpi_built();

/// "Open MPI v4.1.4, ..." (first line of MPI_Get_library_version), or why there is none.
std::string mpi_library_version();

/// Whether this process was started by an MPI launcher (mpirun / orterun, or srun --mpi=pmix),
/// the only way MPI_Init gives it its place in a world of several. `how` says which variable told.
bool started_by_mpi_launcher(std::string* how = nullptr);

/// Initializes MPI if needed, checks that MPI's world is Tandem's (`rank` of `size`), and
/// returns the backend. Throws tandem::Error when the build has no MPI or the worlds differ.
c10::intrusive_ptr<c10d::Backend> make_mpi_backend(int rank, int size, std::chrono::milliseconds timeout);

/// A subgroup's backend: MPI_Comm_split of `parent`'s communicator, called by every rank of the
/// parent (Note [Subgroups]); `rank` of `size` is the caller's place in its subgroup. nullptr for
/// a color < 0 (MPI_UNDEFINED: in no subgroup).
c10::intrusive_ptr<c10d::Backend> split_mpi_backend(const c10::intrusive_ptr<c10d::Backend>& parent, int color,
                                                    int rank, int size);

}  // namespace tandem::comm::detail
