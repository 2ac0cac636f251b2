#pragma once
// tandem::tp::manual_seed: seeds a process of a job with data, tensor and pipeline parallelism as
// Megatron-LM does (_set_random_seed, model_parallel_cuda_manual_seed):
// - the default generators (CPU, every CUDA device): seed + dp_rank + 2^20 × pp_rank. A
//   tensor-parallel group draws alike (its ranks share dp and pp), so activations it holds whole
//   stay the same on every rank; each pipeline stage draws its own (Megatron: seed + 100 ×
//   pp_rank; 2^20 here, past any data-parallel rank, and within the 32 bits of a seed the CPU
//   generator keeps); each data-parallel replica its own, as the Accelerator always seeded them.
// - the tensor-parallel region's (tandem/nn/region_rng.h): that seed + 2718 + tp_rank, Megatron's
//   offset, so dropout on activations cut across the group draws a different mask on each rank.
//
//   tandem::tp::manual_seed(42, {dp_rank, tp_rank, pp_rank});
// The Accelerator calls it with its mesh's ranks (seed: AcceleratorOptions::seed).
#include <cstdint>

namespace tandem::tp {

struct ParallelRanks {
  int dp = 0;  // data-parallel rank (replicate × shard)
  int tp = 0;  // tensor-parallel rank
  int pp = 0;  // pipeline stage
};

/// The default generators' seed for these ranks.
uint64_t default_seed(uint64_t seed, const ParallelRanks& ranks);
/// The tensor-parallel region's seed for these ranks.
uint64_t region_seed(uint64_t seed, const ParallelRanks& ranks);
/// Seeds the default generators and the region's (every device's).
void manual_seed(uint64_t seed, const ParallelRanks& ranks);

}  // namespace tandem::tp
