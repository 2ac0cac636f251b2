#include "accelerate/optimizer_state.h"

#include <set>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "accelerate/sharded_tensors.h"
#include "tandem/error.h"
#include "tandem/zero/param_state.h"

namespace tandem::accelerate {
namespace {

using json = nlohmann::json;
using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;

using zero::OptimizerKind;
using zero::kind_of;
using zero::name_of;
using Kind = OptimizerKind;

// ---- hyper-parameters, with PyTorch's param_groups names ----------------------------------------

template <typename AdamLike>
json adam_options(const AdamLike& o) {
  return {{"lr", o.lr()},
          {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}},
          {"eps", o.eps()},
          {"weight_decay", o.weight_decay()},
          {"amsgrad", o.amsgrad()}};
}

template <typename AdamLike>
void set_adam_options(AdamLike& o, const json& j) {
  const auto betas = j.at("betas").get<std::vector<double>>();
  TANDEM_CHECK(betas.size() == 2, "betas has ", betas.size(), " values, not 2");
  o.lr(j.at("lr").get<double>())
      .betas(std::make_tuple(betas[0], betas[1]))
      .eps(j.at("eps").get<double>())
      .weight_decay(j.at("weight_decay").get<double>())
      .amsgrad(j.at("amsgrad").get<bool>());
}

json options_of(Kind kind, const OptimizerOptions& options) {
  switch (kind) {
    case Kind::Sgd: {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
      return {{"lr", o.lr()},
              {"momentum", o.momentum()},
              {"dampening", o.dampening()},
              {"weight_decay", o.weight_decay()},
              {"nesterov", o.nesterov()}};
    }
    case Kind::Adam: return adam_options(static_cast<const torch::optim::AdamOptions&>(options));
    case Kind::AdamW: return adam_options(static_cast<const torch::optim::AdamWOptions&>(options));
    case Kind::RmsProp: {
      const auto& o = static_cast<const torch::optim::RMSpropOptions&>(options);
      return {{"lr", o.lr()},         {"alpha", o.alpha()},       {"eps", o.eps()},
              {"weight_decay", o.weight_decay()}, {"momentum", o.momentum()}, {"centered", o.centered()}};
    }
    case Kind::Adagrad: {
      const auto& o = static_cast<const torch::optim::AdagradOptions&>(options);
      return {{"lr", o.lr()},
              {"lr_decay", o.lr_decay()},
              {"weight_decay", o.weight_decay()},
              {"initial_accumulator_value", o.initial_accumulator_value()},
              {"eps", o.eps()}};
    }
    case Kind::None: break;
  }
  return json::object();
}

void set_options(Kind kind, OptimizerOptions& options, const json& j) {
  switch (kind) {
    case Kind::Sgd: {
      auto& o = static_cast<torch::optim::SGDOptions&>(options);
      o.lr(j.at("lr").get<double>())
          .momentum(j.at("momentum").get<double>())
          .dampening(j.at("dampening").get<double>())
          .weight_decay(j.at("weight_decay").get<double>())
          .nesterov(j.at("nesterov").get<bool>());
      return;
    }
    case Kind::Adam: return set_adam_options(static_cast<torch::optim::AdamOptions&>(options), j);
    case Kind::AdamW: return set_adam_options(static_cast<torch::optim::AdamWOptions&>(options), j);
    case Kind::RmsProp: {
      auto& o = static_cast<torch::optim::RMSpropOptions&>(options);
      o.lr(j.at("lr").get<double>())
          .alpha(j.at("alpha").get<double>())
          .eps(j.at("eps").get<double>())
          .weight_decay(j.at("weight_decay").get<double>())
          .momentum(j.at("momentum").get<double>())
          .centered(j.at("centered").get<bool>());
      return;
    }
    case Kind::Adagrad: {
      auto& o = static_cast<torch::optim::AdagradOptions&>(options);
      o.lr(j.at("lr").get<double>())
          .lr_decay(j.at("lr_decay").get<double>())
          .weight_decay(j.at("weight_decay").get<double>())
          .initial_accumulator_value(j.at("initial_accumulator_value").get<double>())
          .eps(j.at("eps").get<double>());
      return;
    }
    case Kind::None: break;
  }
}

const std::string& name_in(const ParamNames& names, const at::Tensor& param) {
  auto it = names.find(param.unsafeGetTensorImpl());
  TANDEM_CHECK(it != names.end(), "an optimizer parameter has no name (it belongs to no prepared model)");
  return it->second;
}

}  // namespace

std::string named_optimizer_type(const Optimizer& optimizer) { return name_of(kind_of(optimizer)); }

json describe_optimizer(const Optimizer& optimizer, const std::vector<std::vector<at::Tensor>>& groups,
                        const ParamNames& names) {
  const Kind kind = kind_of(optimizer);
  json out;
  out["type"] = name_of(kind);
  out["param_groups"] = json::array();
  for (size_t g = 0; g < groups.size(); ++g) {
    json params = json::array();
    for (const auto& p : groups[g]) params.push_back(name_in(names, p));
    out["param_groups"].push_back(
        {{"params", params}, {"options", options_of(kind, optimizer.param_groups().at(g).options())}});
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> named_state(const Optimizer& optimizer,
                                                            const std::vector<at::Tensor>& params,
                                                            const ParamNames& names) {
  const Kind kind = kind_of(optimizer);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : params) {
    auto it = optimizer.state().find(p.unsafeGetTensorImpl());
    if (it == optimizer.state().end()) continue;
    for (auto& [key, t] : zero::state_tensors(kind, *it->second)) out.emplace_back(name_in(names, p) + "." + key, t);
  }
  return out;
}

StagedOptimizerState stage_optimizer_state(const Optimizer& optimizer, const std::vector<std::vector<at::Tensor>>& groups,
                                           const ParamNames& names, const std::vector<at::Tensor>& held,
                                           const json& description, const std::vector<std::string>& files,
                                           const std::string& where,
                                           const std::function<HeldPiece(const at::Tensor&)>& held_piece,
                                           bool pipeline) {
  const Kind kind = kind_of(optimizer);
  const std::string saved_type = description.value("type", "");
  TANDEM_CHECK(saved_type == name_of(kind), where, " holds the state of ", saved_type.empty() ? "an unnamed" : "a ",
               saved_type, " optimizer, this one is ", kind == Kind::None ? "of another type" : name_of(kind));
  const auto& saved_groups = description.at("param_groups");
  TANDEM_CHECK(saved_groups.size() == groups.size(), where, " holds ", saved_groups.size(),
               " param group(s), this optimizer has ", groups.size());
  StagedOptimizerState staged;
  std::set<std::string> all;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto saved = saved_groups[g].at("params").get<std::vector<std::string>>();
    std::vector<std::string> mine;
    for (const auto& p : groups[g]) mine.push_back(name_in(names, p));
    if (pipeline) {  // this process's stages' parameters, among all stages' (Note [Pipeline checkpoints])
      const std::set<std::string> there(saved.begin(), saved.end());
      for (const auto& name : mine) {
        TANDEM_CHECK(there.count(name), where, ": param group ", g, " holds no parameter '", name,
                     "' in the checkpoint: the checkpoint belongs to another model or optimizer");
      }
      all.insert(saved.begin(), saved.end());
    } else if (saved != mine) {
      size_t i = 0;
      while (i < saved.size() && i < mine.size() && saved[i] == mine[i]) ++i;
      throw Error(message(where, ": param group ", g, " holds ", saved.size(), " parameters in the checkpoint and ",
                          mine.size(), " here; the first difference is at position ", i, " ('",
                          i < saved.size() ? saved[i] : "", "' there, '", i < mine.size() ? mine[i] : "",
                          "' here): the checkpoint belongs to another model or optimizer"));
    }
    if (!pipeline) all.insert(mine.begin(), mine.end());
    // Checked now on a copy, applied later.
    auto copy = optimizer.param_groups()[g].options().clone();
    try {
      set_options(kind, *copy, saved_groups[g].at("options"));
    } catch (const nlohmann::json::exception& e) {
      throw Error(message(where, ": param group ", g, " has options that do not fit a ", name_of(kind),
                          " optimizer (", e.what(), ")"));
    }
    staged.options.push_back(saved_groups[g].at("options"));
  }
  std::map<std::string, at::Tensor> held_by_name;
  for (const auto& p : held) held_by_name.emplace(name_in(names, p), p);
  const ShardedTensors saved(files, where);  // headers: pieces checked to tile every tensor once
  std::map<std::string, std::map<std::string, at::Tensor>> found;
  for (const auto& full : saved.names()) {
    const auto dot = full.rfind('.');
    const std::string name = dot == std::string::npos ? full : full.substr(0, dot);
    TANDEM_CHECK(dot != std::string::npos && all.count(name), where, ": ", saved.file_of(full), " holds '", full,
                 "', which names no parameter of this optimizer: a file of another checkpoint or model");
    auto it = held_by_name.find(name);
    if (it == held_by_name.end()) continue;
    const std::string key = full.substr(dot + 1);
    const HeldPiece piece = held_piece ? held_piece(it->second) : HeldPiece{it->second.sizes().vec(), it->second.options(), {}, {}};
    if (key == "step" || piece.whole()) {
      found[name][key] = saved.whole(full);  // checked against the parameter by make_state
      continue;
    }
    TANDEM_CHECK(saved.shape(full) == piece.shape, where, ": '", full, "' is ", c10::IntArrayRef(saved.shape(full)),
                 " but the parameter is ", c10::IntArrayRef(piece.shape));
    found[name][key] = saved.chunk(full, piece.offsets, piece.sizes);
  }
  for (auto& [name, tensors] : found) {
    const at::Tensor& param = held_by_name.at(name);
    // Checked against what this rank keeps (an FSDP parameter at rest holds no data: held_piece).
    at::Tensor like = param;
    if (held_piece) {
      const HeldPiece piece = held_piece(param);
      if (!piece.whole() || !param.sizes().equals(piece.shape)) {
        like = at::empty(piece.whole() ? piece.shape : piece.sizes, piece.options);
      }
    }
    staged.states.emplace_back(param, zero::make_state(kind, std::move(tensors), like, where + ": '" + name + "'"));
  }
  return staged;
}

void apply_optimizer_options(Optimizer& optimizer, const std::vector<json>& options) {
  const Kind kind = kind_of(optimizer);
  for (size_t g = 0; g < options.size(); ++g) set_options(kind, optimizer.param_groups()[g].options(), options[g]);
}

void apply_optimizer_state(Optimizer& optimizer, const std::vector<at::Tensor>& held, StagedOptimizerState staged) {
  apply_optimizer_options(optimizer, staged.options);
  for (const auto& p : held) optimizer.state().erase(p.unsafeGetTensorImpl());
  for (auto& [param, state] : staged.states) optimizer.state()[param.unsafeGetTensorImpl()] = std::move(state);
}

}  // namespace tandem::accelerate
