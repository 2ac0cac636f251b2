#pragma once
// The benchmark workloads, defined identically here and in bench/ddp_bench_peer.py (same layers,
// shapes, initialisation order is irrelevant to speed): a small MLP, a CNN with BatchNorm on
// 28x28 images, and a small transformer encoder classifier.
#include <string>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/transformerlayer.h>

#include "tandem/error.h"

namespace tandem::bench {

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 512))),
        fc2(register_module("fc2", torch::nn::Linear(512, 512))),
        fc3(register_module("fc3", torch::nn::Linear(512, 10))) {}
  at::Tensor forward(const at::Tensor& x) { return fc3(fc2(fc1(x.flatten(1)).relu()).relu()); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(32))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(64))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 12 * 12, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto h = bn1(conv1(x)).relu();
    h = at::max_pool2d(bn2(conv2(h)).relu(), 2);
    return fc2(fc1(h.flatten(1)).relu());
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Cnn);

// Tokens [seq, batch] -> logits [batch, 10]; sequence-first, dropout 0, as the Python peer.
struct TransformerImpl : torch::nn::Module {
  TransformerImpl()
      : embed(register_module("embed", torch::nn::Embedding(1000, 128))),
        layer1(register_module("layer1", torch::nn::TransformerEncoderLayer(layer_options()))),
        layer2(register_module("layer2", torch::nn::TransformerEncoderLayer(layer_options()))),
        head(register_module("head", torch::nn::Linear(128, 10))) {}
  static torch::nn::TransformerEncoderLayerOptions layer_options() {
    return torch::nn::TransformerEncoderLayerOptions(128, 4).dim_feedforward(512).dropout(0.0);
  }
  at::Tensor forward(const at::Tensor& tokens) { return head(layer2(layer1(embed(tokens))).mean(0)); }
  torch::nn::Embedding embed;
  torch::nn::TransformerEncoderLayer layer1, layer2;
  torch::nn::Linear head;
};
TORCH_MODULE(Transformer);

constexpr int64_t kSeqLen = 32;

/// A fixed synthetic batch for `model` ("mlp", "cnn", "transformer").
inline std::pair<at::Tensor, at::Tensor> synthetic_batch(const std::string& model, int64_t batch, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor y = at::randint(0, 10, {batch}, gen);
  if (model == "mlp" || model == "cnn") return {at::randn({batch, 1, 28, 28}, gen), y};
  if (model == "transformer") return {at::randint(0, 1000, {kSeqLen, batch}, gen), y};
  throw Error("unknown model '" + model + "' (expected mlp, cnn or transformer)");
}

}  // namespace tandem::bench
