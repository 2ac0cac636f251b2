#include "tandem/zero/partition.h"

#include <algorithm>
#include <numeric>

#include "tandem/error.h"

namespace tandem::zero {

std::vector<std::vector<int>> assign_owners(const std::vector<std::vector<int64_t>>& numels, int world_size) {
  TANDEM_CHECK(world_size >= 1, "ZeRO: world size ", world_size, " is not positive");
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<std::vector<int>> owners;
  for (const auto& group : numels) {
    std::vector<size_t> order(group.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return group[a] > group[b]; });
    std::vector<int> owner(group.size(), 0);
    for (size_t i : order) {
      const auto lightest = std::min_element(load.begin(), load.end());  // the first of equals
      owner[i] = static_cast<int>(lightest - load.begin());
      *lightest += group[i];
    }
    owners.push_back(std::move(owner));
  }
  return owners;
}

}  // namespace tandem::zero
