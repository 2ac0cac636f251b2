#pragma once
// PreparedLoader: a dataset read in batches, sharded across the ranks by DistributedSampler,
// reshuffled every epoch, and able to resume in the middle of an epoch.
//
// Note [Loader position]
// - Each pass over the loader is one epoch: begin() sets the sampler's epoch (the shuffle is
//   seed + epoch, the same on every rank) and the pass ends by advancing the epoch.
// - The epoch's order (the permutation of the dataset) is read in rounds: round b hands rank r
//   the entries (b * batch + i) * W + r. So after k batches per rank the job has consumed the
//   first k * batch * W entries of the order, whatever W is; `samples_done()` is that count (the
//   dataset size once the epoch's last batch is out), and a checkpoint stores (epoch,
//   samples_done) — a position that does not depend on the world size.
// - resume(epoch, samples_done) continues that epoch with order[samples_done:], split among this
//   job's ranks by the sampler's rule (DistributedSampler::set_epoch(epoch, consumed)). At the same
//   world size that is exactly the batches the job would have read without stopping; at another
//   one every sample not yet consumed is read exactly once, plus the padding any epoch has (the
//   head of the order, repeated so that every rank gets as many; gather_for_metrics drops it). The
//   next epoch starts from its first batch, the permutation a job of the new size draws
//   (accelerate applies a skip to every epoch, accelerate#1451).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include "tandem/data/distributed_sampler.h"
#include "tandem/error.h"

namespace tandem::accelerate {

/// Two tensors indexed together along dim 0 (inputs and targets): the plain-tensor dataset.
class TensorPairDataset : public torch::data::datasets::Dataset<TensorPairDataset> {
 public:
  TensorPairDataset(at::Tensor data, at::Tensor targets) : data_(std::move(data)), targets_(std::move(targets)) {
    TANDEM_CHECK(data_.defined() && targets_.defined() && data_.dim() > 0 && targets_.dim() > 0,
                 "prepare_data: data and targets need a batch dimension (dim 0)");
    TANDEM_CHECK(data_.size(0) == targets_.size(0), "prepare_data: data has ", data_.size(0), " rows but targets has ",
                 targets_.size(0));
  }
  torch::data::Example<> get(size_t index) override {
    return {data_[static_cast<int64_t>(index)], targets_[static_cast<int64_t>(index)]};
  }
  std::vector<torch::data::Example<>> get_batch(c10::ArrayRef<size_t> indices) override {
    return {gather(indices)};
  }
  std::optional<size_t> size() const override { return static_cast<size_t>(data_.size(0)); }
  /// One example whose tensors are the rows `indices`, stacked.
  torch::data::Example<> gather(c10::ArrayRef<size_t> indices) const {
    std::vector<int64_t> rows(indices.begin(), indices.end());
    at::Tensor index = at::tensor(rows, at::kLong);
    return {data_.index_select(0, index), targets_.index_select(0, index)};
  }

 private:
  at::Tensor data_, targets_;
};

/// What the Accelerator learns from the loader being iterated (for accumulation and metrics).
struct LoaderProgress {
  bool last_batch = false;      // the batch just handed out is the epoch's last
  int64_t batch_index = 0;      // of the batch just handed out, within the epoch
  int64_t batch_size = 0;       // per rank
  int64_t dataset_size = 0;     // before padding
  int world_size = 1;
  int64_t batches_per_epoch = 0;  // of this pass over the epoch
  int64_t first_sample = 0;       // position in the epoch's order of this round's first sample
};

template <typename Dataset>
class PreparedLoader {
 public:
  struct State;  // below; named here for Iterator's members (clang looks them up in order)
  using Batch = torch::data::Example<>;
  using Observer = std::function<void(const LoaderProgress&)>;

  PreparedLoader(Dataset dataset, int64_t batch_size, int world_size, int rank, data::DistributedSamplerOptions sampler,
                 Observer observer = nullptr)
      : state_(std::make_shared<State>(std::move(dataset), batch_size, world_size, rank, sampler, std::move(observer))) {
    TANDEM_CHECK(batch_size > 0, "prepare_data: batch_size must be positive (got ", batch_size, ")");
    const auto size = state_->dataset.size();
    TANDEM_CHECK(size.has_value(), "prepare_data: the dataset must know its size");
    state_->dataset_size = static_cast<int64_t>(*size);
    state_->sampler.emplace(state_->dataset_size, world_size, rank, sampler);
  }

  class Iterator {
   public:
    Iterator(std::shared_ptr<typename PreparedLoader::State> state, bool end) : state_(std::move(state)), end_(end) {}
    const Batch& operator*() const { return batch_; }
    const Batch* operator->() const { return &batch_; }
    Iterator& operator++() {
      load();
      return *this;
    }
    bool operator!=(const Iterator& other) const { return end_ != other.end_; }
    bool operator==(const Iterator& other) const { return end_ == other.end_; }
    void load() {  // the next batch, or the end of the epoch
      auto& s = *state_;
      const int64_t begin = s.batches_done * s.batch_size;
      if (begin >= static_cast<int64_t>(s.indices.size())) {
        end_ = true;
        ++s.epoch;
        s.batches_done = 0;
        s.start = 0;
        s.in_epoch = false;
        return;
      }
      const int64_t stop = std::min<int64_t>(begin + s.batch_size, static_cast<int64_t>(s.indices.size()));
      std::vector<size_t> rows(s.indices.begin() + begin, s.indices.begin() + stop);
      if constexpr (std::is_same_v<Dataset, TensorPairDataset>) {
        batch_ = s.dataset.gather(rows);  // one index_select per tensor
      } else {
        batch_ = collate(s.dataset.get_batch(rows));
      }
      LoaderProgress progress{stop == static_cast<int64_t>(s.indices.size()),
                              s.batches_done,
                              s.batch_size,
                              s.dataset_size,
                              s.world_size,
                              s.batches_per_epoch(),
                              s.start + s.batches_done * s.batch_size * s.world_size};
      ++s.batches_done;
      if (s.observer) s.observer(progress);
    }

   private:
    static Batch collate(std::vector<Batch> examples) {
      std::vector<at::Tensor> data, target;
      for (auto& e : examples) {
        data.push_back(e.data);
        target.push_back(e.target);
      }
      return {at::stack(data), at::stack(target)};
    }
    std::shared_ptr<typename PreparedLoader::State> state_;
    bool end_;
    Batch batch_;
  };

  /// Starts (or, after resume(), continues) the current epoch.
  Iterator begin() {
    auto& s = *state_;
    if (!s.in_epoch) s.start_epoch();
    Iterator it(state_, false);
    it.load();
    return it;
  }
  Iterator end() { return Iterator(state_, true); }

  /// Batches each rank gets in this pass over the epoch (a whole epoch unless resumed mid-way).
  int64_t batches_per_epoch() const { return state_->batches_per_epoch(); }
  /// Samples each rank reads in this pass (padded with even_batches).
  int64_t samples_per_rank() const { return state_->sampler->num_samples(); }
  int64_t dataset_size() const { return state_->dataset_size; }
  int64_t epoch() const { return state_->epoch; }
  /// Batches of this pass handed out so far.
  int64_t batches_done() const { return state_->batches_done; }
  /// Note [Loader position]: how many entries of the current epoch's order were consumed.
  int64_t samples_done() const { return state_->samples_done(); }
  /// Note [Loader position]: continue epoch `epoch` after the first `samples_done` entries of its
  /// order (a position saved by a job of any world size with this dataset).
  void resume(int64_t epoch, int64_t samples_done) {
    auto& s = *state_;
    TANDEM_CHECK(epoch >= 0 && samples_done >= 0 && samples_done <= s.dataset_size, "resume: position (epoch ",
                 epoch, ", sample ", samples_done, ") is outside this loader's epoch of ", s.dataset_size,
                 " samples: the checkpoint belongs to other data");
    s.epoch = epoch;
    s.start = samples_done;
    s.start_epoch();
    s.batches_done = 0;
  }
  Dataset& dataset() { return state_->dataset; }

  struct State {
    State(Dataset d, int64_t b, int w, int r, data::DistributedSamplerOptions o, Observer obs)
        : dataset(std::move(d)), batch_size(b), world_size(w), rank(r), sampler_options(o), observer(std::move(obs)) {}
    Dataset dataset;
    int64_t batch_size;
    int world_size;
    int rank;
    data::DistributedSamplerOptions sampler_options;
    Observer observer;
    std::optional<data::DistributedSampler> sampler;
    int64_t dataset_size = 0;
    int64_t epoch = 0;
    int64_t start = 0;  // entries of the epoch's order consumed before this pass
    int64_t batches_done = 0;
    bool in_epoch = false;
    std::vector<size_t> indices;
    /// This rank's indices for `epoch` from `start` on, from the sampler (the shuffle of seed + epoch).
    void start_epoch() {
      sampler->set_epoch(epoch, start);
      auto order = sampler->indices();
      indices.assign(order.begin(), order.end());
      in_epoch = true;
    }
    int64_t batches_per_epoch() const {
      const int64_t n = sampler->num_samples();
      return (n + batch_size - 1) / batch_size;
    }
    int64_t samples_done() const {
      if (!in_epoch) return 0;
      if (batches_done >= batches_per_epoch()) return dataset_size;  // the epoch's last batch is out
      return std::min(dataset_size, start + batches_done * batch_size * world_size);
    }
  };

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tandem::accelerate
