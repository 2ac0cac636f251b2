#pragma once
// The one-line error `tandem run`'s flag checks give for a set of options, or "<no error>": how
// the launcher's unit tests read a refusal.
#include <string>

#include "launch/launch_options.h"
#include "tandem/error.h"

namespace tandem::launch::testing {

/// resolve_flags alone: no PATH lookup, no port probe.
inline std::string flags_error(LaunchOptions o) {
  try {
    resolve_flags(o, 0, 2);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace tandem::launch::testing
