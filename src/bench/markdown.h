#pragma once
// results.md: the comparison table in the shape of "performance across model sizes", the step
// breakdown, the recommendation, the projection and its validation; and the comparison of two
// runs (`tandem report A B`).
#include <string>

#include "bench/analysis.h"

namespace tandem::bench {

std::string render_markdown(const Results& results, const Analysis& analysis);

/// Rows present in both runs, matched by (model, impl, strategy, world): samples/s of each and
/// B / A; rows present in one run only are listed under the table.
std::string render_comparison(const std::string& name_a, const Results& a, const Analysis& analysis_a,
                              const std::string& name_b, const Results& b, const Analysis& analysis_b);

}  // namespace tandem::bench
