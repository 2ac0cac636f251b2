#pragma once
// Which rank owns each parameter under ZeRO-1: PyTorch's ZeroRedundancyOptimizer rule, exactly
// (tests/oracles/zero_partition.json is its own output). Per parameter group, in group order, the
// parameters sorted by size, largest first (ties keep their order), each to the rank with the
// fewest elements so far (the lowest such rank); the totals carry over from group to group.
#include <cstdint>
#include <vector>

namespace tandem::zero {

/// `numels[g][i]`: the size of parameter i of group g. Returns the owner of each, same shape.
std::vector<std::vector<int>> assign_owners(const std::vector<std::vector<int64_t>>& numels, int world_size);

}  // namespace tandem::zero
