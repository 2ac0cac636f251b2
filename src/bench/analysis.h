#pragma once
// Everything the report derives from results.json's measurements: the table, the
// recommendation and the projection. `tandem bench` and `tandem report` both call analyze().
#include <nlohmann/json.hpp>

#include "bench/recommend.h"
#include "bench/results.h"
#include "bench/scaling.h"
#include "bench/summary.h"

namespace tandem::bench {

struct Analysis {
  std::vector<Row> rows;
  std::vector<Recommendation> recommendations;
  Scaling scaling;
  std::vector<BackendComparison> backends;  // "Gloo vs MPI", when a run measured both
  // What the renderers show besides: none of them reads the run list.
  std::vector<Run> sweeps;        // one node's link sweeps, by world, then backend
  std::vector<Run> not_measured;  // the runs whose worker said they cannot run here
  bool names_backends = false;    // a run or the configuration names MPI: labels carry their backend
  std::string torch_version;      // of the first record that names one
};

/// Indexes the runs once (run_index.h) and derives everything from that index.
Analysis analyze(const Results& results);

/// The derived sections of results.json ("rows", "recommendations", "links", "projections",
/// "validation", "notes", "backend_comparison"), for readers that do not want to recompute them.
nlohmann::json to_json(const Analysis& analysis);

}  // namespace tandem::bench
