#pragma once
// "rank 3" or "ranks 0, 1, 2": how messages name a set of ranks (the agreement's mismatch line,
// the flight records' analysis). Header-only: the launcher links no LibTorch.
#include <string>
#include <vector>

namespace tandem::detail {

inline std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace tandem::detail
