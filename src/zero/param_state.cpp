#include "tandem/zero/param_state.h"

#include <set>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "tandem/error.h"

namespace tandem::zero {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamState;

at::Tensor step_tensor(int64_t step) { return at::scalar_tensor(step, at::kLong); }

void add(std::vector<std::pair<std::string, at::Tensor>>& out, const char* key, const at::Tensor& t) {
  if (t.defined()) out.emplace_back(key, t);
}

}  // namespace

OptimizerKind kind_of(const Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return OptimizerKind::Sgd;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return OptimizerKind::Adam;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return OptimizerKind::AdamW;
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer)) return OptimizerKind::RmsProp;
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer)) return OptimizerKind::Adagrad;
  return OptimizerKind::None;
}

const char* name_of(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::Sgd: return "SGD";
    case OptimizerKind::Adam: return "Adam";
    case OptimizerKind::AdamW: return "AdamW";
    case OptimizerKind::RmsProp: return "RMSprop";
    case OptimizerKind::Adagrad: return "Adagrad";
    case OptimizerKind::None: break;
  }
  return "";
}

std::vector<std::pair<std::string, at::Tensor>> state_tensors(OptimizerKind kind, const OptimizerParamState& state) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  switch (kind) {
    case OptimizerKind::Sgd:
      add(out, "momentum_buffer", static_cast<const torch::optim::SGDParamState&>(state).momentum_buffer());
      break;
    case OptimizerKind::Adam: {
      const auto& s = static_cast<const torch::optim::AdamParamState&>(state);
      out.emplace_back("step", step_tensor(s.step()));
      add(out, "exp_avg", s.exp_avg());
      add(out, "exp_avg_sq", s.exp_avg_sq());
      add(out, "max_exp_avg_sq", s.max_exp_avg_sq());
      break;
    }
    case OptimizerKind::AdamW: {
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(state);
      out.emplace_back("step", step_tensor(s.step()));
      add(out, "exp_avg", s.exp_avg());
      add(out, "exp_avg_sq", s.exp_avg_sq());
      add(out, "max_exp_avg_sq", s.max_exp_avg_sq());
      break;
    }
    case OptimizerKind::RmsProp: {
      const auto& s = static_cast<const torch::optim::RMSpropParamState&>(state);
      out.emplace_back("step", step_tensor(s.step()));
      add(out, "square_avg", s.square_avg());
      add(out, "momentum_buffer", s.momentum_buffer());
      add(out, "grad_avg", s.grad_avg());
      break;
    }
    case OptimizerKind::Adagrad: {
      const auto& s = static_cast<const torch::optim::AdagradParamState&>(state);
      out.emplace_back("step", step_tensor(s.step()));
      add(out, "sum", s.sum());
      break;
    }
    case OptimizerKind::None: break;
  }
  return out;
}

std::unique_ptr<OptimizerParamState> make_state(OptimizerKind kind, std::map<std::string, at::Tensor> tensors,
                                                const at::Tensor& param, const std::string& where) {
  std::set<std::string> allowed;
  switch (kind) {
    case OptimizerKind::Sgd: allowed = {"momentum_buffer"}; break;
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW: allowed = {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}; break;
    case OptimizerKind::RmsProp: allowed = {"step", "square_avg", "momentum_buffer", "grad_avg"}; break;
    case OptimizerKind::Adagrad: allowed = {"step", "sum"}; break;
    case OptimizerKind::None: break;
  }
  int64_t step = 0;
  for (auto& [key, t] : tensors) {
    TANDEM_CHECK(allowed.count(key), where, ": '", key, "' is not part of a ", name_of(kind), " optimizer's state");
    if (key == "step") {
      TANDEM_CHECK(t.dim() == 0 && t.scalar_type() == at::kLong, where, ": step is ", c10::toString(t.scalar_type()),
                   t.sizes(), ", not a 0-d int64");
      step = t.item<int64_t>();
      continue;
    }
    TANDEM_CHECK(t.sizes() == param.sizes() && t.scalar_type() == param.scalar_type(), where, ": '", key, "' is ",
                 c10::toString(t.scalar_type()), t.sizes(), " but the parameter is ", c10::toString(param.scalar_type()),
                 param.sizes());
    t = t.to(param.device());
  }
  auto get = [&](const char* key) { return tensors.count(key) ? tensors.at(key) : at::Tensor(); };
  switch (kind) {
    case OptimizerKind::Sgd: {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(get("momentum_buffer"));
      return s;
    }
    case OptimizerKind::Adam: {
      auto s = std::make_unique<torch::optim::AdamParamState>();
      s->step(step).exp_avg(get("exp_avg")).exp_avg_sq(get("exp_avg_sq")).max_exp_avg_sq(get("max_exp_avg_sq"));
      return s;
    }
    case OptimizerKind::AdamW: {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step).exp_avg(get("exp_avg")).exp_avg_sq(get("exp_avg_sq")).max_exp_avg_sq(get("max_exp_avg_sq"));
      return s;
    }
    case OptimizerKind::RmsProp: {
      auto s = std::make_unique<torch::optim::RMSpropParamState>();
      s->step(step).square_avg(get("square_avg")).momentum_buffer(get("momentum_buffer")).grad_avg(get("grad_avg"));
      return s;
    }
    case OptimizerKind::Adagrad: {
      auto s = std::make_unique<torch::optim::AdagradParamState>();
      s->step(step).sum(get("sum"));
      return s;
    }
    case OptimizerKind::None: break;
  }
  return nullptr;
}

std::unique_ptr<OptimizerParamState> initial_state(OptimizerKind kind, const torch::optim::OptimizerOptions& group,
                                                  const at::Tensor& like) {
  if (kind != OptimizerKind::Adagrad) return nullptr;
  const auto& o = static_cast<const torch::optim::AdagradOptions&>(group);
  auto s = std::make_unique<torch::optim::AdagradParamState>();
  s->step(0).sum(at::full_like(like, o.initial_accumulator_value(), at::MemoryFormat::Preserve));
  return s;
}

bool is_initial_state(OptimizerKind kind, const OptimizerParamState& state) {
  return kind == OptimizerKind::Adagrad && static_cast<const torch::optim::AdagradParamState&>(state).step() == 0;
}

}  // namespace tandem::zero
