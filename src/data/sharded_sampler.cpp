#include "tandem/data/sharded_sampler.h"

#include <torch/serialize/archive.h>

#include "tandem/error.h"

namespace tandem::data {

ShardedSampler::ShardedSampler(int64_t dataset_size, int world_size, int rank, DistributedSamplerOptions options)
    : state_(std::make_shared<State>(
          State{world_size, rank, options, DistributedSampler(dataset_size, world_size, rank, options), {}, 0})) {
  reset();
}

void ShardedSampler::set_epoch(int64_t epoch) {
  state_->sampler.set_epoch(epoch);
  reset();
}

int64_t ShardedSampler::epoch() const { return state_->sampler.epoch(); }
int64_t ShardedSampler::num_samples() const { return state_->sampler.num_samples(); }

void ShardedSampler::reset(std::optional<size_t> new_size) {
  if (new_size && static_cast<int64_t>(*new_size) != state_->sampler.dataset_size()) {
    const int64_t epoch = state_->sampler.epoch();
    state_->sampler = DistributedSampler(static_cast<int64_t>(*new_size), state_->world_size, state_->rank, state_->options);
    state_->sampler.set_epoch(epoch);
  }
  state_->indices = state_->sampler.indices();
  state_->cursor = 0;
}

std::optional<std::vector<size_t>> ShardedSampler::next(size_t batch_size) {
  if (batch_size == 0) throw Error("ShardedSampler: batch size must be positive");
  auto& s = *state_;
  if (s.cursor >= s.indices.size()) return std::nullopt;
  const size_t end = std::min(s.indices.size(), s.cursor + batch_size);
  std::vector<size_t> batch(s.indices.begin() + static_cast<std::ptrdiff_t>(s.cursor),
                            s.indices.begin() + static_cast<std::ptrdiff_t>(end));
  s.cursor = end;
  return batch;
}

void ShardedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", at::tensor(state_->sampler.epoch(), at::kLong), /*is_buffer=*/true);
  archive.write("cursor", at::tensor(static_cast<int64_t>(state_->cursor), at::kLong), /*is_buffer=*/true);
}

void ShardedSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor epoch, cursor;
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("cursor", cursor, /*is_buffer=*/true);
  state_->sampler.set_epoch(epoch.item<int64_t>());
  reset();
  state_->cursor = std::min(static_cast<size_t>(cursor.item<int64_t>()), state_->indices.size());
}

}  // namespace tandem::data
