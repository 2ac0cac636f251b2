#include "tandem/data/distributed_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "tandem/error.h"

namespace tandem::data {
namespace {

// Python's math.ceil(a / b) for b > 0 and any sign of a.
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int world_size, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), world_size_(world_size), rank_(rank), options_(options) {
  if (dataset_size < 0) throw Error("DistributedSampler: dataset size " + std::to_string(dataset_size) + " is negative");
  if (world_size < 1) throw Error("DistributedSampler: world size " + std::to_string(world_size) + " must be >= 1");
  if (rank < 0 || rank >= world_size) {
    throw Error("DistributedSampler: rank " + std::to_string(rank) + " is not in 0.." + std::to_string(world_size - 1));
  }
  num_samples_ = options.drop_last() && dataset_size % world_size != 0
                     ? ceil_div(dataset_size - world_size, world_size)
                     : ceil_div(dataset_size, world_size);
  if (num_samples_ < 0) num_samples_ = 0;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  if (options_.shuffle()) {
    // The same generator and call as Python's torch.randperm(n, generator=g) with
    // g.manual_seed(seed + epoch): identical permutations from the same LibTorch.
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed() + static_cast<uint64_t>(epoch_));
    at::Tensor perm = at::randperm(dataset_size_, generator, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    std::copy(p, p + dataset_size_, order.begin());
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) order[static_cast<size_t>(i)] = i;
  }
  const auto total = static_cast<size_t>(total_size());
  if (!options_.drop_last() && total > order.size() && !order.empty()) {
    const size_t n = order.size();
    order.reserve(total);
    for (size_t i = n; i < total; ++i) order.push_back(order[(i - n) % n]);
  } else if (order.size() > total) {
    order.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < order.size() && i < total; i += static_cast<size_t>(world_size_)) {
    mine.push_back(order[i]);
  }
  return mine;
}

}  // namespace tandem::data
