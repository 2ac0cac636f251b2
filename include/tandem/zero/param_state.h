#pragma once
// The per-parameter state of the LibTorch optimizers Tandem knows by type (SGD, Adam, AdamW,
// RMSprop, Adagrad), as named tensors with PyTorch's state keys: what checkpoints write by name
// (Note [Optimizer state by name]) and what ZeRO-2 slices into flat shards and back.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

namespace tandem::zero {

enum class OptimizerKind { None, Sgd, Adam, AdamW, RmsProp, Adagrad };

OptimizerKind kind_of(const torch::optim::Optimizer& optimizer);
/// "SGD", "Adam", "AdamW", "RMSprop", "Adagrad"; "" for None.
const char* name_of(OptimizerKind kind);

/// One parameter's state as (key, tensor): "step" a 0-d int64, the buffers as they are (undefined
/// ones left out).
std::vector<std::pair<std::string, at::Tensor>> state_tensors(OptimizerKind kind,
                                                              const torch::optim::OptimizerParamState& state);

/// A new state from such tensors, checked (the keys of the type; every buffer of `like`'s shape
/// and dtype, moved to its device). Throws tandem::Error prefixed by `where`.
std::unique_ptr<torch::optim::OptimizerParamState> make_state(OptimizerKind kind, std::map<std::string, at::Tensor> tensors,
                                                              const at::Tensor& like, const std::string& where);

/// The state an optimizer makes for a parameter before its first step, if it makes one then
/// (Adagrad, at construction: `sum` filled with the group's initial_accumulator_value); else null.
std::unique_ptr<torch::optim::OptimizerParamState> initial_state(OptimizerKind kind,
                                                                 const torch::optim::OptimizerOptions& group,
                                                                 const at::Tensor& like);
/// Whether `state` is one an optimizer makes before its first step (Adagrad's, at step 0): what
/// an optimizer that never stepped may hold.
bool is_initial_state(OptimizerKind kind, const torch::optim::OptimizerParamState& state);

}  // namespace tandem::zero
