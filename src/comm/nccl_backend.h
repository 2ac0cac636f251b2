#pragma once
// Internal: creates c10d::ProcessGroupNCCL. Compiled only where Tandem is built with CUDA, so the
// NCCL and CUDA headers stay out of every other translation unit.
#include <chrono>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tandem::comm::detail {

/// Whether this build has the NCCL path and a CUDA device is visible.
bool nccl_available();

/// Null when !nccl_available().
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);

}  // namespace tandem::comm::detail
