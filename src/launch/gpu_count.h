#pragma once
// How many CUDA devices this process sees, without LibTorch: `tandem run --nproc-per-node gpu`
// must not load 400 MiB of libraries to count GPUs.

namespace tandem::launch {

/// Devices the CUDA driver reports (CUDA_VISIBLE_DEVICES applies); 0 without a driver.
int visible_gpu_count();

}  // namespace tandem::launch
