#pragma once
// Before DDP starts, every rank must hold the same model: the same number of parameters, and
// for each the same shape, dtype and device type. A mismatch would otherwise surface as a hang or
// as silently wrong averages.
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"

namespace tandem::ddp {

/// Collective: all ranks call it. On a mismatch every rank throws the same tandem::Error, naming
/// the first differing parameter and the ranks involved.
void verify_same_model(comm::ProcessGroup& pg, const std::vector<at::Tensor>& parameters,
                       const std::vector<std::string>& names);

/// Every parameter and buffer on one device, a CPU or a CUDA one that the process group serves.
void verify_placement(const comm::ProcessGroup& pg, const std::vector<at::Tensor>& tensors,
                      const std::vector<std::string>& names);

}  // namespace tandem::ddp
