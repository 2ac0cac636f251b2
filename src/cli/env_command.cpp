// `tandem env`: what a bug report needs, in one block.
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <ATen/Parallel.h>

#include "cli/commands.h"
#include "tandem/comm/cuda_info.h"
#include "tandem/comm/cpu_backend.h"
#include "tandem/comm/debug.h"
#include "tandem/comm/world.h"
#include "tandem/error.h"
#include "tandem/version.h"

namespace tandem::cli {
namespace {

void line(const char* key, const std::string& value) { std::printf("%-22s %s\n", key, value.c_str()); }

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

}  // namespace

Command add_env_command(CLI::App& app) {
  app.add_subcommand("env", "Print versions, devices, threads and the distributed environment");
  return []() {
    auto cuda = comm::cuda_info();
    std::printf("Tandem environment report\n");
    line("tandem", version());
    line("libtorch (built)", built_with_torch_version());
    line("cuda/nccl path", cuda.compiled ? "compiled" : "not compiled (CPU-only build)");
    line("cuda runtime", cuda.runtime_version.empty() ? "-" : cuda.runtime_version);
    line("nccl", cuda.nccl_version.empty() ? "-" : cuda.nccl_version);
    line("gloo", "c10d ProcessGroupGloo inside LibTorch");
    line("mpi", comm::mpi_backend_built() ? comm::mpi_library_version() : "not built (no libopenmpi-dev at build time)");
    line("cuda devices", std::to_string(cuda.devices.size()));
    for (const auto& d : cuda.devices) {
      char text[160];
      std::snprintf(text, sizeof(text), "%s, %.1f GiB, sm_%d%d", d.name.c_str(), d.memory_gib, d.major, d.minor);
      line(("  cuda:" + std::to_string(d.index)).c_str(), text);
    }
    line("cpu cores", std::to_string(std::thread::hardware_concurrency()));
    line("intra-op threads", std::to_string(at::get_num_threads()));
    line("inter-op threads", std::to_string(at::get_num_interop_threads()));
    line("OMP_NUM_THREADS", env_or("OMP_NUM_THREADS", "(unset)"));
    for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                             "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"}) {
      line(name, env_or(name, "(unset)"));
    }
    int rc = 0;
    try {
      const auto level = comm::debug_level_from_env();
      line("collective debug", std::string(comm::to_string(level)) +
                                   (level == comm::DebugLevel::Detail ? " (every call compared across ranks)" : ""));
    } catch (const Error& e) {
      line("collective debug", std::string("INVALID: ") + e.what());
      rc = 2;
    }
    try {
      const auto choice = comm::resolve_cpu_backend(comm::cpu_backend_from_env());
      line("cpu backend", std::string(comm::to_string(choice.backend)) + " (" + choice.reason + ")");
    } catch (const Error& e) {
      line("cpu backend", std::string("INVALID: ") + e.what());
      rc = 2;
    }
    try {
      line("distributed", comm::World::from_env().describe());
    } catch (const Error& e) {
      line("distributed", std::string("INVALID: ") + e.what());
      rc = 2;
    }
    std::printf("\nATen parallel configuration:\n%s", at::get_parallel_info().c_str());
    return rc;
  };
}

}  // namespace tandem::cli
