#include "tandem/comm/cuda_info.h"

#include "tandem/error.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#endif

namespace tandem::comm {

#ifdef TANDEM_HAVE_CUDA
void bind_cuda_device(int local_rank) {
  const int visible = cuda_device_count();
  if (visible == 0) return;
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_for_local_rank(local_rank, visible)));
}

int cuda_device_count() {
  try {
    return c10::cuda::device_count();
  } catch (...) {
    return 0;
  }
}

CudaInfo cuda_info() {
  CudaInfo info;
  info.compiled = true;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
    info.runtime_version = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
  }
  try {
    info.nccl_version = c10d::getNcclVersion();
  } catch (...) {
  }
  for (int i = 0; i < cuda_device_count(); ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    info.devices.push_back(CudaDevice{i, p.name, p.totalGlobalMem / double(1 << 30), p.major, p.minor});
  }
  return info;
}
#else
int cuda_device_count() { return 0; }
CudaInfo cuda_info() { return {}; }
void bind_cuda_device(int) {}
#endif

int device_for_local_rank(int local_rank, int visible) {
  TANDEM_CHECK(local_rank >= 0 && local_rank < visible, "LOCAL_RANK=", local_rank, " has no CUDA device: ", visible,
               " visible (one device per rank on a node: start at most ", visible,
               " workers per node, or check CUDA_VISIBLE_DEVICES)");
  return local_rank;
}

}  // namespace tandem::comm
