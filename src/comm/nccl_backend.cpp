#include "comm/nccl_backend.h"

#ifdef TANDEM_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace tandem::comm::detail {

#ifdef TANDEM_HAVE_CUDA
bool nccl_compiled() { return true; }

bool is_nccl_work(const c10d::Work& work) {
  return dynamic_cast<const c10d::ProcessGroupNCCL::WorkNCCL*>(&work) != nullptr;
}

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size, int device,
                                                    std::chrono::milliseconds timeout) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  c10::cuda::set_device(index);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  // Enforced by the NCCL watchdog (and by wait() under TORCH_NCCL_BLOCKING_WAIT=1), never by a
  // host wait of ours: Note [Stream-ordered waits] in process_group.cpp.
  options->timeout = timeout;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  backend->setBoundDeviceId(c10::Device(c10::kCUDA, index));
  return backend;
}
#else
bool nccl_compiled() { return false; }

bool is_nccl_work(const c10d::Work&) { return false; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int, int,
                                                    std::chrono::milliseconds) {
  return {};
}
#endif

}  // namespace tandem::comm::detail
