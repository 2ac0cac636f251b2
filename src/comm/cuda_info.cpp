#include "tandem/comm/cuda_info.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#endif

namespace tandem::comm {

#ifdef TANDEM_HAVE_CUDA
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
#endif

}  // namespace tandem::comm
