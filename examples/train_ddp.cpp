// A complete DDP training loop, top to bottom: a synthetic classification task (points around
// 4 centres), sharded with ShardedSampler, trained with DistributedDataParallel. Every rank ends
// with the same weights; rank 0 prints loss and accuracy per epoch.
//   tandem run --nproc-per-node 2 -- ./train_ddp [--epochs 5]
#include <cstdio>
#include <cstring>
#include <cstdlib>

#include <ATen/ATen.h>
#include <torch/data/dataloader.h>
#include <torch/data/datasets/base.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "tandem/comm/process_group.h"
#include "tandem/data/sharded_sampler.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/error.h"

namespace {

// 4,096 points in 16 dimensions, label = which of 4 centres it was drawn around. The same on
// every rank (fixed seed); each rank reads its own shard.
struct Blobs : torch::data::datasets::Dataset<Blobs> {
  Blobs() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    at::Tensor centres = at::randn({4, 16}, gen) * 0.5;  // overlapping: not every point is separable
    labels = at::randint(0, 4, {4096}, gen);
    points = centres.index_select(0, labels) + at::randn({4096, 16}, gen);
  }
  torch::data::Example<> get(size_t i) override {
    return {points[static_cast<int64_t>(i)], labels[static_cast<int64_t>(i)]};
  }
  std::optional<size_t> size() const override { return static_cast<size_t>(points.size(0)); }
  at::Tensor points, labels;
};

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(16, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(fc1(x).relu()); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

}  // namespace

int main(int argc, char** argv) {
  int epochs = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--epochs") == 0) epochs = std::atoi(argv[i + 1]);
  }
  try {
    auto world = tandem::comm::World::from_env();
    auto pg = tandem::comm::ProcessGroup::create(world);
    if (world.is_main()) {
      std::printf("train_ddp: %d ranks, CPU collectives on %s\n", world.world_size,
                  tandem::comm::to_string(pg->cpu_backend()));
    }

    Blobs dataset;
    tandem::data::ShardedSampler sampler(static_cast<int64_t>(*dataset.size()), world.world_size, world.rank,
                                         tandem::data::DistributedSamplerOptions().seed(0));
    auto loader = torch::data::make_data_loader(dataset, sampler, torch::data::DataLoaderOptions(64));

    torch::manual_seed(world.rank);  // different on purpose: DDP starts every rank from rank 0's
    Net net;
    tandem::ddp::DistributedDataParallel model(net, pg);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));

    for (int epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);
      at::Tensor loss_sum = at::zeros({1}, at::kDouble), seen = at::zeros({1}, at::kDouble);
      for (auto& batch : *loader) {
        std::vector<at::Tensor> xs, ys;
        for (auto& e : batch) {
          xs.push_back(e.data);
          ys.push_back(e.target);
        }
        at::Tensor x = at::stack(xs), y = at::stack(ys);
        opt.zero_grad();
        at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
        loss.backward();  // gradients averaged across ranks during backward
        opt.step();
        loss_sum += loss.item<double>() * x.size(0);
        seen += x.size(0);
      }
      pg->all_reduce(loss_sum);
      pg->all_reduce(seen);
      at::Tensor correct;
      {
        at::NoGradGuard no_grad;
        correct = (model->forward(dataset.points).argmax(1) == dataset.labels).sum().to(at::kDouble).unsqueeze(0);
      }
      if (world.is_main()) {
        std::printf("epoch %d: mean loss %.4f over %.0f samples, accuracy %.1f%%\n", epoch,
                    loss_sum.item<double>() / seen.item<double>(), seen.item<double>(),
                    100.0 * correct.item<double>() / static_cast<double>(*dataset.size()));
      }
    }
    // Every rank holds the same weights: compare a checksum.
    at::Tensor checksum = at::zeros({1}, at::kDouble);
    for (const auto& p : model->parameters()) checksum += p.to(at::kDouble).sum();
    auto all = pg->all_gather(checksum);
    for (const auto& c : all) {
      if (!at::equal(c, all[0])) throw tandem::Error("ranks ended with different weights");
    }
    if (world.is_main()) std::printf("all %d ranks hold identical weights (checksum %.6f)\n", world.world_size, checksum.item<double>());
    return 0;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "train_ddp: %s\n", e.what());
    return 2;
  }
}
