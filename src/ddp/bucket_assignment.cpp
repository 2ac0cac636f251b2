#include "tandem/ddp/bucket_assignment.h"

#include <algorithm>

#include "tandem/error.h"

namespace tandem::ddp {

BucketAssignment compute_bucket_assignment(const std::vector<TensorSpec>& tensors,
                                           const std::vector<int64_t>& size_limits,
                                           const std::vector<int64_t>& order) {
  if (size_limits.empty()) throw Error("bucket assignment needs at least one size limit");
  for (auto limit : size_limits) {
    if (limit <= 0) throw Error("bucket size limits must be positive, got " + std::to_string(limit));
  }
  if (!order.empty()) {
    std::vector<bool> seen(tensors.size(), false);
    if (order.size() != tensors.size()) throw Error("bucket order must name every tensor once");
    for (auto i : order) {
      if (i < 0 || i >= static_cast<int64_t>(tensors.size()) || seen[static_cast<size_t>(i)]) {
        throw Error("bucket order must be a permutation of the tensor indices");
      }
      seen[static_cast<size_t>(i)] = true;
    }
  }

  struct Open {
    c10::ScalarType dtype;
    c10::Device device;
    int64_t group;
    std::vector<int64_t> indices;
    int64_t bytes = 0;
    size_t limit_index = 0;
  };
  std::vector<Open> open;  // one per kind, in first-seen order (a handful: a linear scan is fine)
  BucketAssignment result;

  for (size_t step = 0; step < tensors.size(); ++step) {
    const int64_t index = order.empty() ? static_cast<int64_t>(step) : order[step];
    const TensorSpec& t = tensors[static_cast<size_t>(index)];
    auto kind = std::find_if(open.begin(), open.end(),
                             [&](const Open& o) { return o.dtype == t.dtype && o.device == t.device && o.group == t.group; });
    if (kind == open.end()) {
      open.push_back(Open{t.dtype, t.device, t.group, {}, 0, 0});
      kind = std::prev(open.end());
    }
    kind->indices.push_back(index);
    kind->bytes += t.bytes;
    const int64_t limit = size_limits[kind->limit_index];
    if (kind->bytes >= limit) {
      result.buckets.push_back(std::move(kind->indices));
      result.size_limits.push_back(limit);
      kind->indices = {};
      kind->bytes = 0;
      kind->limit_index = std::min(kind->limit_index + 1, size_limits.size() - 1);
    }
  }
  for (auto& o : open) {
    if (o.indices.empty()) continue;
    result.buckets.push_back(std::move(o.indices));
    result.size_limits.push_back(size_limits[o.limit_index]);
  }
  if (order.empty()) {
    std::vector<size_t> by_min(result.buckets.size());
    for (size_t i = 0; i < by_min.size(); ++i) by_min[i] = i;
    std::stable_sort(by_min.begin(), by_min.end(), [&](size_t a, size_t b) {
      return *std::min_element(result.buckets[a].begin(), result.buckets[a].end()) <
             *std::min_element(result.buckets[b].begin(), result.buckets[b].end());
    });
    BucketAssignment sorted;
    for (size_t i : by_min) {
      sorted.buckets.push_back(std::move(result.buckets[i]));
      sorted.size_limits.push_back(result.size_limits[i]);
    }
    return sorted;
  }
  return result;
}

}  // namespace tandem::ddp
