#include "tandem/comm/cpu_backend.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "comm/mpi_backend.h"
#include "tandem/error.h"

namespace tandem::comm {

const char* to_string(CpuBackend backend) {
  switch (backend) {
    case CpuBackend::Auto: return "auto";
    case CpuBackend::Gloo: return "gloo";
    case CpuBackend::Mpi: return "mpi";
  }
  return "?";
}

CpuBackend parse_cpu_backend(const std::string& text, const std::string& variable) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "auto" || lower.empty()) return CpuBackend::Auto;
  if (lower == "gloo") return CpuBackend::Gloo;
  if (lower == "mpi") return CpuBackend::Mpi;
  throw Error(variable + "='" + text + "' is not a CPU backend: use auto, gloo or mpi");
}

CpuBackend cpu_backend_from_env() {
  const char* value = std::getenv("TANDEM_CPU_BACKEND");
  return value ? parse_cpu_backend(value, "TANDEM_CPU_BACKEND") : CpuBackend::Auto;
}

CpuBackendChoice resolve_cpu_backend(CpuBackend requested) {
  if (requested == CpuBackend::Gloo) return {CpuBackend::Gloo, "chosen"};
  if (requested == CpuBackend::Mpi) return {CpuBackend::Mpi, "chosen"};
  std::string how;
  const bool launched = detail::started_by_mpi_launcher(&how);
  if (!detail::mpi_built()) return {CpuBackend::Gloo, "auto: this build has no MPI backend"};
  if (!launched) return {CpuBackend::Gloo, "auto: not started by an MPI launcher"};
  return {CpuBackend::Mpi, "auto: started by an MPI launcher (" + how + " is set)"};
}

bool mpi_backend_built() { return detail::mpi_built(); }

std::string mpi_library_version() { return detail::mpi_library_version(); }

}  // namespace tandem::comm
