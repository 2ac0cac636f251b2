#pragma once
// Which engine carries the collectives of CPU tensors: Gloo (TCP, everywhere) or Open MPI
// (shared memory on one host, TCP or InfiniBand between hosts; docs/design/mpi.md).
// CUDA tensors always go through NCCL.
//
//   auto   (default) MPI when this build has it and the processes were started by an MPI
//          launcher (mpirun, `tandem run --backend mpi`, srun --mpi=pmix); Gloo otherwise.
//   gloo   always Gloo.
//   mpi    always MPI; an error when the build has no MPI or no MPI launcher started the job.
//
// ProcessGroupOptions().cpu_backend(...) wins over TANDEM_CPU_BACKEND, which wins over auto.
#include <optional>
#include <string>

namespace tandem::comm {

struct World;

enum class CpuBackend { Auto, Gloo, Mpi };
const char* to_string(CpuBackend backend);

/// "auto", "gloo" or "mpi" (any case). Throws tandem::Error naming `variable` otherwise.
CpuBackend parse_cpu_backend(const std::string& text, const std::string& variable);

/// TANDEM_CPU_BACKEND, else Auto (empty counts as unset).
CpuBackend cpu_backend_from_env();

/// The backend `requested` means for this process (never Auto), and why, for `tandem env`.
struct CpuBackendChoice {
  CpuBackend backend = CpuBackend::Gloo;
  std::string reason;
};
CpuBackendChoice resolve_cpu_backend(CpuBackend requested);

/// Whether this build of Tandem has the MPI backend.
bool mpi_backend_built();
/// The MPI library's own version line ("Open MPI v4.1.4, ..."), or why there is none.
std::string mpi_library_version();

}  // namespace tandem::comm
