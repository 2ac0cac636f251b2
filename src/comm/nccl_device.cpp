#include "comm/nccl_device.h"

#include "tandem/comm/cuda_info.h"
#include "tandem/error.h"

namespace tandem::comm::detail {

NcclDevice choose_nccl_device(bool compiled, bool wanted, int local_rank, int visible) {
  if (!compiled) return {-1, "this build of Tandem has no CUDA path (configure with TANDEM_WITH_CUDA=ON)"};
  if (!wanted) return {-1, "ProcessGroupOptions.use_nccl is false"};
  if (visible <= 0) return {-1, "no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver)"};
  try {
    return {device_for_local_rank(local_rank, visible), ""};
  } catch (const Error& e) {
    return {-1, e.what()};
  }
}

}  // namespace tandem::comm::detail
