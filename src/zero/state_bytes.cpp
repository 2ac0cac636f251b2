#include "tandem/zero/state_bytes.h"

#include <initializer_list>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "tandem/error.h"

namespace tandem::zero {

namespace {

int64_t bytes_of(std::initializer_list<at::Tensor> tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) {
    if (t.defined()) n += static_cast<int64_t>(t.nbytes());
  }
  return n;
}

}  // namespace

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  int64_t total = 0;
  for (const auto& [key, state] : optimizer.state()) {
    (void)key;
    const OptimizerParamState* s = state.get();
    if (const auto* sgd = dynamic_cast<const SGDParamState*>(s)) {
      total += bytes_of({sgd->momentum_buffer()});
    } else if (const auto* adam = dynamic_cast<const AdamParamState*>(s)) {
      total += bytes_of({adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()});
    } else if (const auto* adamw = dynamic_cast<const AdamWParamState*>(s)) {
      total += bytes_of({adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()});
    } else if (const auto* rms = dynamic_cast<const RMSpropParamState*>(s)) {
      total += bytes_of({rms->square_avg(), rms->momentum_buffer(), rms->grad_avg()});
    } else if (const auto* adagrad = dynamic_cast<const AdagradParamState*>(s)) {
      total += bytes_of({adagrad->sum()});
    } else {
      throw Error("optimizer_state_bytes: an optimizer state of a type it does not know (SGD, Adam, AdamW, RMSprop "
                  "and Adagrad are counted)");
    }
  }
  return total;
}

}  // namespace tandem::zero
