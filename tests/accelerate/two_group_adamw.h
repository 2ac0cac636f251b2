#pragma once
// The ZeRO tests' optimizer: AdamW with the weights (lr 1e-2, weight decay 0.1) and the biases
// (lr 3e-2, no decay) in two param groups, over the 9-13-5 MLP they train (sizes no world size
// divides).
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

namespace tandem::test {

inline torch::nn::Sequential zero_net() {
  return torch::nn::Sequential(torch::nn::Linear(9, 13), torch::nn::Tanh(), torch::nn::Linear(13, 5));
}

inline std::vector<torch::optim::OptimizerParamGroup> two_group_adamw(torch::nn::Module& net) {
  std::vector<at::Tensor> weights, biases;
  for (const auto& item : net.named_parameters()) {
    (item.key().find("bias") != std::string::npos ? biases : weights).push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(weights, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.1)));
  groups.emplace_back(biases, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-2).weight_decay(0)));
  return groups;
}

}  // namespace tandem::test
