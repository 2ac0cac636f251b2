// ShardedSampler inside LibTorch's own DataLoader: each rank reads exactly its
// DistributedSampler shard, in batches, epoch after epoch.
#include <gtest/gtest.h>

#include <set>

#include <torch/data/dataloader.h>
#include <torch/data/datasets/base.h>

#include "tandem/data/sharded_sampler.h"

namespace {

// Example i carries i, so the loader's output shows which indices it read.
struct IndexDataset : torch::data::datasets::Dataset<IndexDataset, int64_t> {
  explicit IndexDataset(size_t n) : n_(n) {}
  int64_t get(size_t index) override { return static_cast<int64_t>(index); }
  std::optional<size_t> size() const override { return n_; }
  size_t n_;
};

}  // namespace

TEST(ShardedSampler, EachRankReadsItsShardThroughALibTorchLoader) {
  const int world = 3;
  const int64_t n = 20;
  std::multiset<int64_t> everything;
  for (int rank = 0; rank < world; ++rank) {
    tandem::data::ShardedSampler sampler(n, world, rank, tandem::data::DistributedSamplerOptions().seed(7));
    auto loader = torch::data::make_data_loader(IndexDataset(n), sampler, torch::data::DataLoaderOptions(3));
    for (int epoch = 0; epoch < 3; ++epoch) {
      sampler.set_epoch(epoch);
      std::vector<int64_t> read;
      size_t batches = 0;
      for (auto& batch : *loader) {
        EXPECT_LE(batch.size(), 3u);
        read.insert(read.end(), batch.begin(), batch.end());
        ++batches;
      }
      tandem::data::DistributedSampler expected(n, world, rank, tandem::data::DistributedSamplerOptions().seed(7));
      expected.set_epoch(epoch);
      EXPECT_EQ(read, expected.indices()) << "rank " << rank << " epoch " << epoch;
      EXPECT_EQ(batches, 3u);  // 7 samples in batches of 3
      if (epoch == 0) everything.insert(read.begin(), read.end());
    }
  }
  // The padded epoch (21 = 7 x 3) covers every index; one is repeated.
  EXPECT_EQ(everything.size(), 21u);
  for (int64_t i = 0; i < n; ++i) EXPECT_GE(everything.count(i), 1u);
}

TEST(ShardedSampler, SavesAndResumesMidEpoch) {
  tandem::data::ShardedSampler a(50, 2, 1);
  a.set_epoch(4);
  (void)a.next(10);
  torch::serialize::OutputArchive out;
  a.save(out);
  std::stringstream stream;
  out.save_to(stream);
  torch::serialize::InputArchive in;
  in.load_from(stream);
  tandem::data::ShardedSampler b(50, 2, 1);
  b.load(in);
  EXPECT_EQ(b.epoch(), 4);
  EXPECT_EQ(b.next(100), a.next(100));
}
