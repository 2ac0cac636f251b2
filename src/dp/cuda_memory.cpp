#include "dp/cuda_memory.h"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace tandem::dp::detail {

#ifdef TANDEM_HAVE_CUDA
int64_t cuda_peak_allocated_bytes(int device) {
  using c10::CachingDeviceAllocator::StatType;
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
}
void cuda_reset_peak(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}
#else
int64_t cuda_peak_allocated_bytes(int) { return 0; }
void cuda_reset_peak(int) {}
#endif

}  // namespace tandem::dp::detail
