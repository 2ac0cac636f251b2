#pragma once
// The memory frontier's report, extended by the plan (Note [Outlook] in frontier_outlook.cpp):
// every probe's measured peak beside the planned one, and the family members no strategy fitted,
// planned. Each figure says whether it was measured or predicted.
#include <string>

#include <nlohmann/json.hpp>

namespace tandem::plan {

/// Markdown for a `tandem bench --memory-budget` results.json ("" when it holds no Tandem probe).
std::string frontier_outlook(const nlohmann::json& results);

}  // namespace tandem::plan
