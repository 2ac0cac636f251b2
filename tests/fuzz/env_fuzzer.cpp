// libFuzzer harness for tandem::comm::World::from_lookup, the launch-environment parser: the input
// is NAME=VALUE lines (the first '=' splits; a later line for the same name wins; lines without
// '=' are skipped). A tandem::Error is the expected answer to a bad environment; any other
// exception, a sanitizer report or an accepted world that breaks World's invariants is a finding.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "tandem/comm/world.h"
#include "tandem/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> env;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    start = end + 1;
  }
  auto lookup = [&env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  try {
    const auto w = tandem::comm::World::from_lookup(lookup);
    // What every accepted world satisfies (world.h, docs/guide.md "Environment contract").
    bool ok = w.rank >= 0 && w.rank < w.world_size && w.local_rank >= 0 && w.local_rank < w.local_world_size &&
              w.local_world_size <= w.world_size && w.group_rank >= 0 && w.master_port >= 0 &&
              w.master_port <= 65535 && w.restart_count >= 0 && w.max_restarts >= 0;
    if (w.world_size > 1) ok = ok && !w.master_addr.empty() && w.master_port != 0;
    if (!ok) std::abort();
    w.describe();
    // The device a rank uses is the one its LOCAL_RANK names, or an error: never another one.
    if (!w.device(false).is_cpu() || w.device(true).index() != w.local_rank) std::abort();
  } catch (const tandem::Error&) {
  }
  return 0;
}
