#pragma once
// DistributedSampler: which dataset indices this rank reads in an epoch, with exactly the rule of
// PyTorch's torch.utils.data.DistributedSampler (so a C++ and a Python job shard identically):
//
//   num_samples = ceil(N / W), or ceil((N - W) / W) with drop_last when N % W != 0
//   total       = num_samples * W
//   order       = randperm(N) from a CPU generator seeded seed + epoch (shuffle), else 0..N-1
//   pad         by repeating the head of `order` (the whole list as often as needed) up to
//               `total`; with drop_last, truncate to `total` instead
//   rank r      takes order[r : total : W]
//
// Tandem's one extension, for checkpoints that resume at another world size (Note [Loader
// position] in tandem/accelerate/data_loader.h): set_epoch(epoch, consumed) continues an epoch
// whose first `consumed` entries of `order` were already read, by a job of any world size. The
// rule above then applies to order[consumed:] (N - consumed entries, padded from the head of the
// epoch's order as before), so with consumed = 0 it is exactly PyTorch's, and a job that stopped
// after k rounds of b samples per rank and continues at the same world size with
// consumed = k * b * W reads exactly what it would have read without stopping.
//
// LibTorch's own DistributedRandomSampler differs (contiguous blocks, pads before shuffling,
// mt19937(epoch)), which is why this is not a wrapper around it.
//
// Example:
//   tandem::data::DistributedSampler sampler(dataset_size, world.world_size, world.rank,
//       tandem::data::DistributedSamplerOptions().shuffle(true).seed(0));
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);
//     for (int64_t i : sampler.indices()) ...
//   }
#include <cstdint>
#include <vector>

#include <torch/arg.h>

namespace tandem::data {

/// Options of DistributedSampler, with the names and defaults of PyTorch's.
///
/// Example:
///   auto options = tandem::data::DistributedSamplerOptions().shuffle(true).seed(42).drop_last(false);
struct DistributedSamplerOptions {
  /// A new permutation every epoch (randperm seeded seed + epoch), else the dataset order.
  TORCH_ARG(bool, shuffle) = true;
  /// The same on every rank: the epochs' permutations depend on it.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Drop the tail that does not divide evenly among the ranks, instead of padding it.
  TORCH_ARG(bool, drop_last) = false;
};

class DistributedSampler {
 public:
  /// Throws tandem::Error for a negative size, world size < 1 or rank outside 0..world_size-1.
  DistributedSampler(int64_t dataset_size, int world_size, int rank,
                     DistributedSamplerOptions options = {});

  /// Chooses the shuffle of the coming epoch (same on every rank), and where in it to start: after
  /// the first `consumed` entries of the epoch's order (0..dataset size; throws otherwise).
  void set_epoch(int64_t epoch, int64_t consumed = 0);
  int64_t epoch() const { return epoch_; }
  int64_t consumed() const { return consumed_; }

  /// This rank's indices for the current epoch (from `consumed` on), in order.
  std::vector<int64_t> indices() const;
  /// How many indices every rank gets in the current epoch (from `consumed` on).
  int64_t num_samples() const { return num_samples_; }
  /// num_samples() * world size: the padded (or truncated) epoch length.
  int64_t total_size() const { return num_samples_ * world_size_; }
  int64_t dataset_size() const { return dataset_size_; }

 private:
  int64_t dataset_size_;
  int world_size_;
  int rank_;
  DistributedSamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t consumed_ = 0;
  int64_t num_samples_ = 0;
};

}  // namespace tandem::data
