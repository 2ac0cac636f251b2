#pragma once
// What this build and this machine offer on the GPU side, for `tandem env`, the launcher's
// `--nproc-per-node gpu` and the tests that skip without a GPU.
#include <string>
#include <vector>

namespace tandem::comm {

struct CudaDevice {
  int index = 0;
  std::string name;
  double memory_gib = 0;
  int major = 0, minor = 0;  // compute capability
};

struct CudaInfo {
  bool compiled = false;          // Tandem built with the CUDA / NCCL path
  std::string runtime_version;    // e.g. "13.0", empty without CUDA
  std::string nccl_version;       // e.g. "2.28.9", empty without CUDA
  std::vector<CudaDevice> devices;
};

/// Visible CUDA devices; 0 on a CPU-only build or machine (never throws).
int cuda_device_count();
CudaInfo cuda_info();

/// The CUDA device a rank should use: LOCAL_RANK among `visible` devices. Throws tandem::Error
/// naming both numbers when there are fewer (pure: testable without a GPU).
int device_for_local_rank(int local_rank, int visible);
/// Makes cuda:device_for_local_rank(...) the current device of this thread (and of the CUDA
/// context every later CUDA call uses); does nothing without GPUs. Call before any CUDA work.
void bind_cuda_device(int local_rank);

}  // namespace tandem::comm
