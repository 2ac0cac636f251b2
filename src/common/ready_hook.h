#pragma once
// Internal: a post hook for an autograd node (here: a parameter's AccumulateGrad) that runs a
// callback once the node has produced its output. Shared by the DDP reducer and DataParallel.
#include <functional>
#include <utility>

#include <torch/csrc/autograd/function_hook.h>

namespace tandem::detail {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace tandem::detail
