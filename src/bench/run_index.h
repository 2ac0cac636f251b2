#pragma once
// The runs of one results.json, indexed once by (model, implementation, strategy, backend, world,
// nodes): the analysis looks measurements up here instead of scanning the run list.
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/results.h"

namespace tandem::bench {

/// One timed measurement's runs, by repeat.
using ByRepeat = std::map<int, const Run*>;

/// Built from `results`, which must outlive it (it points into results.runs).
class RunIndex {
 public:
  explicit RunIndex(const Results& results);

  const Results& results() const { return results_; }

  /// The timed runs (repeat >= 0, supported) of `impl` `strategy` on `model` at `world` on `nodes`,
  /// on `backend` ("": the strategy's default, Gloo for a multi-process one). Empty when none.
  const ByRepeat& repeats(const std::string& model, const std::string& impl, const std::string& strategy, int world,
                          int nodes = 1, const std::string& backend = "") const;
  /// The (world, nodes) shapes with timed runs of that measurement, ascending.
  std::vector<std::pair<int, int>> shapes(const std::string& model, const std::string& impl,
                                          const std::string& strategy, const std::string& backend) const;
  /// The link sweeps with points, in the file's order.
  const std::vector<const Run*>& sweeps() const { return sweeps_; }
  /// The runs whose worker said the combination cannot run here, in the file's order.
  const std::vector<const Run*>& unsupported() const { return unsupported_; }
  /// Every node count a run was spread over (1 always).
  const std::set<int>& node_counts() const { return node_counts_; }
  /// Whether a run names `backend`.
  bool has_backend(const std::string& backend) const { return backends_.count(backend) > 0; }
  /// The torch version the first record that names one gives ("" when none does).
  const std::string& torch_version() const { return torch_version_; }

 private:
  // (model, impl, strategy, backend, world, nodes)
  using Key = std::tuple<std::string, std::string, std::string, std::string, int, int>;
  const Results& results_;
  std::map<Key, ByRepeat> timed_;
  std::vector<const Run*> sweeps_, unsupported_;
  std::set<int> node_counts_{1};
  std::set<std::string> backends_;
  std::string torch_version_;
};

}  // namespace tandem::bench
