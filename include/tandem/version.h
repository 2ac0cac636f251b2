#pragma once

namespace tandem {

/// Tandem's version, e.g. "0.1.0".
const char* version();
/// The LibTorch version Tandem was compiled against.
const char* built_with_torch_version();
/// Whether this build compiled the CUDA / NCCL path.
bool built_with_cuda();

}  // namespace tandem
