#pragma once
// Internal: which CUDA device a rank's NCCL backend is bound to, decided before any CUDA work.
//
// Note [Device binding]
// Every rank uses cuda:LOCAL_RANK (torchrun's contract: one process per device, CUDA_VISIBLE_DEVICES
// left whole). ProcessGroup::create makes it the current device and binds the NCCL backend to it.
// A rank whose LOCAL_RANK has no device gets no NCCL backend, and its first CUDA collective fails
// with one line naming both numbers; its CPU collectives keep working, so a CPU job may run more
// ranks per node than there are GPUs, as with PyTorch's "cpu:gloo,cuda:nccl" group. (Failing at
// creation would refuse such jobs; creating NCCL lazily on a missing device would hang its peers.)
#include <string>

namespace tandem::comm::detail {

struct NcclDevice {
  int index = -1;           // >= 0: bind NCCL to cuda:index
  std::string unavailable;  // otherwise why there is no NCCL backend (one line)
};

/// Pure, so that it is tested without a GPU.
NcclDevice choose_nccl_device(bool compiled, bool wanted, int local_rank, int visible);

}  // namespace tandem::comm::detail
