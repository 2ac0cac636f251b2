#pragma once
// The projection section of the report: link parameters (fitted from this run's all-reduce sweep
// or given), predicted step time and scaling efficiency at the shapes asked for with --project,
// and the model's validation against the world sizes this run measured (Note [Projection from a
// run] in scaling.cpp; the formulas are in projection.h).
#include <optional>
#include <string>
#include <vector>

#include "bench/projection.h"
#include "bench/run_index.h"
#include "bench/summary.h"

namespace tandem::bench {

struct ProjectionRow {
  std::string model;
  double compute_s = 0, backward_s = 0, overlap = 0, comm_scale = 1;
  Prediction prediction;       // ring all-reduce (what the calibration used)
  Prediction tree_prediction;  // the same step with halving-doubling between nodes and ranks
};

struct ValidationRow {
  std::string model;
  int world = 1, nodes = 1;
  double measured_s = 0, predicted_s = 0;
  bool calibration = false;  // the overlap was fitted here: agreement is by construction
  double error() const { return (predicted_s - measured_s) / measured_s; }
};

struct Scaling {
  std::optional<Link> intra, inter;
  std::vector<SweepPoint> sweep;  // the measurement the fitted link came from
  int sweep_world = 0, sweep_nodes = 1;
  std::vector<ProjectionRow> projections;
  std::vector<ValidationRow> validation;
  std::vector<std::string> notes;  // what could not be projected, and why
};

/// Empty (no links, no rows) when the run measured no sweep and asked for no projection.
Scaling project_run(const RunIndex& index);

}  // namespace tandem::bench
