#pragma once
// What `tandem plan` prints and writes: the table of the fastest configurations that fit, the
// refusals by reason, one JSON object per configuration, and the memory plot.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/search.h"

namespace tandem::plan {

/// The job in two lines: model, batch, precision; the hardware.
std::string describe_job(const Job& job);
/// The `top` fastest configurations that fit (a table), then how many were refused, by reason.
std::string plan_table(const Job& job, const std::vector<Estimate>& estimates, int top);
/// One configuration as `--json` prints it (one object per line).
nlohmann::json estimate_json(const Estimate& e);
/// plan.png in `dir` (its inputs under dir/plots/): the memory per rank of the `top` fastest that
/// fit and of the closest that do not, stacked by kind, against a device's memory. Returns the
/// note of what was not drawn ("" when it was).
std::string draw_plan_plot(const std::string& dir, const Job& job, const std::vector<Estimate>& estimates, int top);

}  // namespace tandem::plan
