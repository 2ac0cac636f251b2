#pragma once
// tandem::nn::RegionRng: random numbers of their own for the code of a tensor-parallel region,
// Megatron's RNG tracker ("model-parallel-rng", get_cuda_rng_tracker().fork()) for LibTorch.
//
// In a tensor-parallel group every rank holds some activations whole (the same on every rank:
// a residual stream, a row-parallel layer's output) and some cut (a column-parallel layer's
// heads). Dropout on the whole ones must draw the same mask on every rank, or the copies part;
// dropout on the cut ones must draw a different mask on each rank, or rank 0's heads and rank 1's
// get the same mask where one process would draw independent ones. Megatron seeds the default
// generators alike across the group and keeps a second state per device, seeded by the
// tensor-parallel rank, swapped in around the cut regions' random draws:
//
//   tandem::tp::manual_seed(seed, {dp_rank, tp_rank, pp_rank});   // or the Accelerator does it
//   ...
//   at::Tensor probs = at::softmax(scores, -1);   // this rank's heads
//   {
//     tandem::nn::RegionRng region;               // this rank's own numbers
//     probs = attn_dropout(probs);
//   }
//   at::Tensor out = proj(probs.matmul(v));       // row-parallel: whole again
//   out = resid_dropout(out);                     // the group's shared numbers
//
// The default generators go on afterwards where they were, the region's where it stopped.
// Activation checkpointing captures and restores the region's states with the defaults'
// (nn/checkpoint.h), so a recompute draws the same masks; Accelerator::save_state saves them.
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace tandem::nn {

/// Seeds the region's state of the CPU generator and of every CUDA device's (Megatron's
/// tracker.add("model-parallel-rng", seed)). Until then, a RegionRng seeds it from the default
/// generators' seed + 2718, as Megatron offsets it.
void seed_region_rng(uint64_t seed);

/// For its lifetime, the default generators (CPU and every CUDA device's) draw the region's
/// numbers. Nested in another, it does nothing: the outer one holds the region.
class RegionRng {
 public:
  RegionRng();
  ~RegionRng();
  RegionRng(const RegionRng&) = delete;
  RegionRng& operator=(const RegionRng&) = delete;

 private:
  bool outermost_ = false;
};

/// The region's states, per device (CPU first); empty before any seeding. What checkpoints and
/// saved training states carry (torch.cuda.get_rng_state's counterpart for the region).
std::vector<std::pair<c10::Device, at::Tensor>> region_rng_states();
void set_region_rng_states(const std::vector<std::pair<c10::Device, at::Tensor>>& states);

}  // namespace tandem::nn
