#pragma once
// The collective debug level, PyTorch's TORCH_DISTRIBUTED_DEBUG under Tandem's own name.
//
//   OFF     (default) collectives run as issued.
//   INFO    the same; kept so that a value valid for PyTorch is valid here.
//   DETAIL  before every collective the ranks compare what they are about to call (operation,
//           reduction or root, dtype, device, shape, sequence number) and all fail with both
//           sides named when they differ, instead of hanging or reducing mismatched buffers.
//           Costs one small all-gather per collective: for debugging, not for production.
//
// TANDEM_DEBUG wins over TORCH_DISTRIBUTED_DEBUG; ProcessGroupOptions().debug(...) over both.
#include <optional>
#include <string>

namespace tandem::comm {

enum class DebugLevel { Off, Info, Detail };
const char* to_string(DebugLevel level);

/// "OFF", "INFO" or "DETAIL" (any case). Throws tandem::Error naming `variable` otherwise.
DebugLevel parse_debug_level(const std::string& text, const std::string& variable);

/// TANDEM_DEBUG, else TORCH_DISTRIBUTED_DEBUG, else Off.
DebugLevel debug_level_from_env();

}  // namespace tandem::comm
