#pragma once
// The host allocator's setting for training processes (Note [Host allocator] in
// src/common/host_allocator.cpp): glibc's malloc keeps freed memory for reuse instead of handing
// it back to the kernel, so a training step stops paying page faults for its activations.
// FSDP prefers the opposite: large blocks mapped afresh and returned when freed (return-large).
// TANDEM_HOST_ALLOCATOR other than keep-freed, return-large or system: tandem::Error on every call.
#include <string>

namespace tandem {

struct HostAllocatorSetting {
  bool tuned = false;  // freed memory is kept for reuse (mallopt accepted)
  std::string mode;    // "keep-freed", "return-large", "system", "tunables" (GLIBC_TUNABLES), "unchanged" (refused)
  std::string detail;  // what was set, or why nothing was (one line)
};

enum class HostAllocatorPolicy {
  KeepFreed,    // freed memory stays in the process for the next step (DDP, DataParallel)
  ReturnLarge,  // blocks of 4 MiB or more are mapped afresh and unmapped when freed, smaller kept (FSDP)
};

/// Applies the setting once per process (later calls return the first result); the Accelerator,
/// DistributedDataParallel, DataParallel and FullyShardedDataParallel call it when constructed,
/// each with the policy it prefers. TANDEM_HOST_ALLOCATOR (keep-freed, return-large, system)
/// overrides that; system keeps glibc's defaults; a GLIBC_TUNABLES that sets glibc.malloc.* is
/// respected as it is.
const HostAllocatorSetting& tune_host_allocator(HostAllocatorPolicy preferred = HostAllocatorPolicy::KeepFreed);

}  // namespace tandem
