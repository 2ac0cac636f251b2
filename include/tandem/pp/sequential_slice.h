#pragma once
// Cutting a model made of a Sequential of blocks into pipeline stages: which blocks each stage
// holds, and a module that runs those blocks under the whole model's names ("blocks.3.q.weight"
// in a stage as in the whole model), so that a pipeline's checkpoint is the whole model's (Note
// [Pipeline checkpoints] in src/accelerate/accelerator_state.cpp). tiny_gpt and the benchmark's
// GPT cut themselves with these.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

namespace tandem::pp {

/// Blocks [first, last) of `layers` for stage `stage` of `stages`: as even as they go, the first
/// `layers % stages` stages one block more (so a stage without a block can only come last).
inline std::pair<int64_t, int64_t> stage_blocks(int64_t layers, int64_t stage, int64_t stages) {
  const int64_t base = layers / stages, extra = layers % stages;
  const int64_t first = stage * base + std::min(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

/// Entries [first, last) of `all`, registered under their indices in it, run in order. The
/// modules are shared with `all` (the same parameters, not copies).
struct SequentialSliceImpl : torch::nn::Module {
  SequentialSliceImpl(const torch::nn::Sequential& all, int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const torch::nn::AnyModule& block = all->begin()[i];
      register_module(std::to_string(i), block.ptr());
      blocks.push_back(block);
    }
  }
  at::Tensor forward(at::Tensor h) {
    for (auto& block : blocks) h = block.forward(h);
    return h;
  }
  std::vector<torch::nn::AnyModule> blocks;
};
TORCH_MODULE(SequentialSlice);

}  // namespace tandem::pp
