#pragma once
// ShardedSampler: DistributedSampler as a LibTorch data-loader sampler, so any LibTorch dataset
// can be read one shard per rank through torch::data::make_data_loader.
//
// Copies share one state: keep a copy to call set_epoch() after handing the sampler to a loader.
//
// Example:
//   tandem::data::ShardedSampler sampler(dataset.size().value(), world.world_size, world.rank,
//                                        tandem::data::DistributedSamplerOptions().seed(42));
//   auto loader = torch::data::make_data_loader(std::move(dataset), sampler,
//                                               torch::data::DataLoaderOptions(64));
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     sampler.set_epoch(epoch);               // a new shuffle, the same on every rank
//     for (auto& batch : *loader) { ... }     // this rank's num_samples() examples
//   }
#include <memory>
#include <optional>
#include <vector>

#include <torch/data/samplers/base.h>

#include "tandem/data/distributed_sampler.h"

namespace tandem::data {

class ShardedSampler : public torch::data::samplers::Sampler<> {
 public:
  ShardedSampler(int64_t dataset_size, int world_size, int rank, DistributedSamplerOptions options = {});

  void set_epoch(int64_t epoch);
  int64_t epoch() const;
  int64_t num_samples() const;

  /// Called by the loader at the start of each pass: this epoch's indices, from the beginning.
  /// A new size (the loader's dataset changed) re-shards.
  void reset(std::optional<size_t> new_size = std::nullopt) override;
  std::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  struct State {
    int world_size;
    int rank;
    DistributedSamplerOptions options;
    DistributedSampler sampler;
    std::vector<int64_t> indices;
    size_t cursor = 0;
  };
  std::shared_ptr<State> state_;
};

}  // namespace tandem::data
