#pragma once
// The recommendation: for each model, the strategy to use on this machine, argued from the
// table's own numbers (Note [Recommendation] in recommend.cpp).
#include <string>
#include <vector>

#include "bench/summary.h"

namespace tandem::bench {

struct Recommendation {
  std::string model;
  std::string strategy;  // a user strategy
  int world = 1;
  std::string why;       // one paragraph of figures from the table
};

std::vector<Recommendation> recommend(const std::vector<Row>& rows, const std::vector<std::string>& models);

}  // namespace tandem::bench
