#pragma once
// Internal: the CUDA caching allocator's statistics, compiled only with CUDA (0 elsewhere).
#include <cstdint>

namespace tandem::dp::detail {

int64_t cuda_peak_allocated_bytes(int device);
void cuda_reset_peak(int device);

}  // namespace tandem::dp::detail
