#include "tandem/comm/debug.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "tandem/error.h"

namespace tandem::comm {

const char* to_string(DebugLevel level) {
  switch (level) {
    case DebugLevel::Off: return "OFF";
    case DebugLevel::Info: return "INFO";
    case DebugLevel::Detail: return "DETAIL";
  }
  return "?";
}

DebugLevel parse_debug_level(const std::string& text, const std::string& variable) {
  std::string upper = text;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  if (upper == "OFF" || upper.empty()) return DebugLevel::Off;
  if (upper == "INFO") return DebugLevel::Info;
  if (upper == "DETAIL") return DebugLevel::Detail;
  throw Error(variable + "='" + text + "' is not a debug level: use OFF, INFO or DETAIL");
}

DebugLevel debug_level_from_env() {
  for (const char* variable : {"TANDEM_DEBUG", "TORCH_DISTRIBUTED_DEBUG"}) {
    const char* value = std::getenv(variable);
    if (value && *value) return parse_debug_level(value, variable);  // empty counts as unset
  }
  return DebugLevel::Off;
}

}  // namespace tandem::comm
