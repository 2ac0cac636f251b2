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
  set_epoch(0);
}

void DistributedSampler::set_epoch(int64_t epoch, int64_t consumed) {
  if (consumed < 0 || consumed > dataset_size_) {
    throw Error("DistributedSampler: " + std::to_string(consumed) + " samples consumed of an epoch of " +
                std::to_string(dataset_size_));
  }
  epoch_ = epoch;
  consumed_ = consumed;
  const int64_t left = dataset_size_ - consumed;
  num_samples_ = options_.drop_last() && left % world_size_ != 0 ? ceil_div(left - world_size_, world_size_)
                                                                 : ceil_div(left, world_size_);
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
  // The rest of the epoch, padded from the head of the epoch's order (PyTorch's rule when
  // nothing was consumed).
  const auto total = static_cast<size_t>(total_size());
  const auto consumed = static_cast<size_t>(consumed_);
  const size_t n = order.size();
  std::vector<int64_t> rest(order.begin() + static_cast<std::ptrdiff_t>(consumed), order.end());
  if (!options_.drop_last() && total > rest.size() && n > 0) {
    const size_t left = rest.size();
    rest.reserve(total);
    for (size_t i = left; i < total; ++i) rest.push_back(order[(i - left) % n]);
  } else if (rest.size() > total) {
    rest.resize(total);
  }
  order = std::move(rest);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < order.size() && i < total; i += static_cast<size_t>(world_size_)) {
    mine.push_back(order[i]);
  }
  return mine;
}

}  // namespace tandem::data
