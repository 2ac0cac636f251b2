#pragma once
// The host allocator's setting for training processes (Note [Host allocator] in
// src/common/host_allocator.cpp): glibc's malloc keeps freed memory for reuse instead of handing
// it back to the kernel, so a training step stops paying page faults for its activations.
// TANDEM_HOST_ALLOCATOR other than keep-freed or system: tandem::Error on every call.
#include <string>

namespace tandem {

struct HostAllocatorSetting {
  bool tuned = false;  // freed memory is kept for reuse (mallopt accepted)
  std::string mode;    // "keep-freed", "system", "tunables" (GLIBC_TUNABLES), "unchanged" (refused)
  std::string detail;  // what was set, or why nothing was (one line)
};

/// Applies the setting once per process (later calls return the first result); the Accelerator,
/// DistributedDataParallel and DataParallel call it when constructed. TANDEM_HOST_ALLOCATOR=system
/// keeps glibc's defaults; a GLIBC_TUNABLES that sets glibc.malloc.* is respected as it is.
const HostAllocatorSetting& tune_host_allocator();

}  // namespace tandem
