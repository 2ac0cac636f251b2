#include "tandem/tp/random.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "tandem/error.h"
#include "tandem/nn/region_rng.h"

namespace tandem::tp {

uint64_t default_seed(uint64_t seed, const ParallelRanks& ranks) {
  TANDEM_CHECK(ranks.dp >= 0 && ranks.tp >= 0 && ranks.pp >= 0, "tp::manual_seed: ranks must be >= 0, got dp ",
               ranks.dp, ", tp ", ranks.tp, ", pp ", ranks.pp);
  return seed + static_cast<uint64_t>(ranks.dp) + (static_cast<uint64_t>(ranks.pp) << 20);
}

uint64_t region_seed(uint64_t seed, const ParallelRanks& ranks) {
  return default_seed(seed, ranks) + 2718 + static_cast<uint64_t>(ranks.tp);
}

void manual_seed(uint64_t seed, const ParallelRanks& ranks) {
  torch::manual_seed(default_seed(seed, ranks));  // the CPU generator and every CUDA device's
  nn::seed_region_rng(region_seed(seed, ranks));
}

}  // namespace tandem::tp
