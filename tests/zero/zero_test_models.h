#pragma once
// What the ZeRO tests share: a model whose layer sizes divide no world size, two param groups
// (weights with decay, biases without), the five optimizer types, and the comparison.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace tandem::test::zero {

constexpr int kSteps = 20;

inline torch::nn::Sequential make_net() {
  torch::manual_seed(7);  // the same initial weights on every rank and in both runs
  return torch::nn::Sequential(torch::nn::Linear(13, 11), torch::nn::Tanh(), torch::nn::Linear(11, 7),
                               torch::nn::Tanh(), torch::nn::Linear(7, 3));
}

// Two groups: the weights (lr a, decay) and the biases (lr b, no decay).
inline std::vector<std::vector<at::Tensor>> split_params(torch::nn::Module& net) {
  std::vector<at::Tensor> weights, biases;
  for (const auto& item : net.named_parameters()) {
    (item.key().find("bias") != std::string::npos ? biases : weights).push_back(item.value());
  }
  return {weights, biases};
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<std::vector<at::Tensor>>)>;

template <typename Opt, typename Options>
MakeOptimizer two_groups(Options weights, Options biases) {
  return [weights, biases](std::vector<std::vector<at::Tensor>> groups) -> std::unique_ptr<torch::optim::Optimizer> {
    std::vector<torch::optim::OptimizerParamGroup> param_groups;
    param_groups.emplace_back(groups[0], std::make_unique<Options>(weights));
    param_groups.emplace_back(groups[1], std::make_unique<Options>(biases));
    return std::make_unique<Opt>(std::move(param_groups), weights);
  };
}

inline std::vector<std::pair<std::string, MakeOptimizer>> optimizers() {
  using namespace torch::optim;
  return {
      {"SGD momentum", two_groups<SGD>(SGDOptions(0.05).momentum(0.9).weight_decay(1e-3), SGDOptions(0.1).momentum(0.9))},
      {"Adam", two_groups<Adam>(AdamOptions(1e-2).weight_decay(1e-3), AdamOptions(3e-2))},
      {"AdamW", two_groups<AdamW>(AdamWOptions(1e-2).weight_decay(0.1), AdamWOptions(3e-2).weight_decay(0))},
      {"RMSprop", two_groups<RMSprop>(RMSpropOptions(1e-2).momentum(0.5), RMSpropOptions(2e-2))},
      {"Adagrad", two_groups<Adagrad>(AdagradOptions(5e-2), AdagradOptions(1e-1))},
  };
}

inline double max_relative_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, ((a[i] - b[i]).abs() / b[i].abs().clamp_min(1e-12)).max().item<double>());
  }
  return worst;
}

}  // namespace tandem::test::zero
