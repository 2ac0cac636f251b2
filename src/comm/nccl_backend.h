#pragma once
// Internal: creates c10d::ProcessGroupNCCL. Compiled only where Tandem is built with CUDA, so the
// NCCL and CUDA headers stay out of every other translation unit.
#include <chrono>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace tandem::comm::detail {

/// Whether this build has the NCCL path.
bool nccl_compiled();

/// Whether `work` is a ProcessGroupNCCL work (waited in stream order: Note [Stream-ordered waits]).
bool is_nccl_work(const c10d::Work& work);

/// Makes cuda:`device` the current device, then creates the NCCL backend bound to it (Note
/// [Device binding]). Communicators are created at the first CUDA collective, as in PyTorch
/// without eager init, so ranks without a device never leave the others waiting in NCCL's setup.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size, int device,
                                                    std::chrono::milliseconds timeout);

}  // namespace tandem::comm::detail
