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
  std::string backend;   // its CPU backend when the run compared backends ("" otherwise)
  std::string why;       // one paragraph of figures from the table
};

/// "ddp", or "ddp (mpi)" when `rows` hold more than one CPU backend (or MPI alone).
std::string strategy_name(const Row& row, const std::vector<Row>& rows);
/// The recommendation's "ddp on 2 devices" / "ddp (mpi) on 2 devices" / "single".
std::string recommendation_title(const Recommendation& rec);

std::vector<Recommendation> recommend(const std::vector<Row>& rows, const std::vector<std::string>& models);

}  // namespace tandem::bench
