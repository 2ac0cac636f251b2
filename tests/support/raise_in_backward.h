#pragma once
// Failures injected into backward, for the tests of a backward that raises (Note [Failed
// backward]): an identity whose backward throws "injected failure in backward" when the place it
// stands for is the armed one. `Place` is the test's own enum of places; its zero value is
// "nowhere", the state until a test arms one.
//
//   enum class RaiseAt : int64_t { Nowhere, Output, MidModel };
//   using Raising = tandem::test::RaiseInBackward<RaiseAt>;
//   nn::Sequential net(nn::Linear(3, 3), tandem::test::Raises<RaiseAt>(RaiseAt::MidModel), ...);
//   Raising::armed() = RaiseAt::MidModel;   // this rank's next backward raises there
#include <cstdint>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace tandem::test {

template <typename Place>
struct RaiseInBackward : torch::autograd::Function<RaiseInBackward<Place>> {
  /// The place whose backward raises now.
  static Place& armed() {
    static Place place{};
    return place;
  }
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, Place where) {
    ctx->saved_data["where"] = static_cast<int64_t>(where);
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (static_cast<int64_t>(armed()) == ctx->saved_data["where"].toInt()) {
      throw std::runtime_error("injected failure in backward");
    }
    return {grads[0], at::Tensor()};
  }
};

/// The same as a module (an entry of a Sequential).
template <typename Place>
struct RaisesImpl : torch::nn::Module {
  explicit RaisesImpl(Place where) : where(where) {}
  at::Tensor forward(const at::Tensor& x) { return RaiseInBackward<Place>::apply(x, where); }
  Place where;
};
template <typename Place>
using Raises = torch::nn::ModuleHolder<RaisesImpl<Place>>;

}  // namespace tandem::test
