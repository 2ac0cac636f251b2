#include "bench/run_index.h"

namespace tandem::bench {

RunIndex::RunIndex(const Results& results) : results_(results) {
  for (const auto& r : results.runs) {
    node_counts_.insert(r.nodes);
    backends_.insert(r.backend);
    if (torch_version_.empty() && r.versions.contains("torch")) torch_version_ = r.versions.value("torch", std::string());
    if (!r.unsupported.empty()) {
      unsupported_.push_back(&r);
      continue;
    }
    if (r.strategy == link_sweep().name && !r.sweep.empty()) sweeps_.push_back(&r);
    if (r.repeat >= 0) {
      timed_[{r.model, r.impl, r.strategy, normal_backend(r.strategy, r.backend), r.world, r.nodes}][r.repeat] = &r;
    }
  }
}

const ByRepeat& RunIndex::repeats(const std::string& model, const std::string& impl, const std::string& strategy,
                                  int world, int nodes, const std::string& backend) const {
  static const ByRepeat none;
  auto it = timed_.find({model, impl, strategy, normal_backend(strategy, backend), world, nodes});
  return it == timed_.end() ? none : it->second;
}

std::vector<std::pair<int, int>> RunIndex::shapes(const std::string& model, const std::string& impl,
                                                  const std::string& strategy, const std::string& backend) const {
  std::vector<std::pair<int, int>> out;
  const std::string wanted = normal_backend(strategy, backend);
  for (const auto& [key, runs] : timed_) {
    const auto& [m, i, s, b, world, nodes] = key;
    if (m == model && i == impl && s == strategy && b == wanted) out.emplace_back(world, nodes);
  }
  return out;
}

}  // namespace tandem::bench
