#pragma once
// Note [Optimizer state by name]
// A checkpoint's optimizer state must load whatever the world size and whether ZeRO shards it,
// so it is written by parameter name, never by position or by rank:
//
//   optimizer_<o>.safetensors              the whole optimizer (one file), or
//   optimizer_<o>.rank<r>.safetensors      one per rank of a sharded optimizer: its owned parameters
//
// each holding "<parameter name>.<key>" tensors with the global shapes: PyTorch's state keys
// (SGD momentum_buffer; Adam and AdamW step, exp_avg, exp_avg_sq, max_exp_avg_sq; RMSprop step,
// square_avg, momentum_buffer, grad_avg; Adagrad step, sum), `step` as a 0-d int64. state.json
// describes each optimizer once (describe_optimizer): its type and, per param group, the
// parameter names and the hyper-parameters with PyTorch's names. A loader reads every file of the
// optimizer, keeps the state of the parameters it holds under its own sharding (all of them when
// whole) and checks everything before anything changes (stage, then apply). A parameter's state
// is its tensors' bits, so what loads equals what was saved, bit for bit, at any world size.
//
// Other optimizer types (a user's own) have no such format: they are written as LibTorch
// archives and load only at the world size and sharding they were saved with.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

namespace tandem::accelerate {

/// Parameter names, by the parameter's TensorImpl (what LibTorch's optimizers key their state by).
using ParamNames = std::unordered_map<const void*, std::string>;

/// "SGD", "Adam", "AdamW", "RMSprop" or "Adagrad"; "" for a type without a named format.
std::string named_optimizer_type(const torch::optim::Optimizer& optimizer);

/// {"type": ..., "param_groups": [{"params": [names], "options": {"lr": ..., ...}}]} for the
/// param groups `groups` (every parameter of each group, also the ones other ranks own).
nlohmann::json describe_optimizer(const torch::optim::Optimizer& optimizer,
                                  const std::vector<std::vector<at::Tensor>>& groups, const ParamNames& names);

/// The state of `params` as "<name>.<key>" tensors (parameters without state yet have none).
std::vector<std::pair<std::string, at::Tensor>> named_state(const torch::optim::Optimizer& optimizer,
                                                            const std::vector<at::Tensor>& params,
                                                            const ParamNames& names);

/// A checkpoint's optimizer state, read and checked, not yet applied.
struct StagedOptimizerState {
  std::vector<nlohmann::json> options;                                   // per group
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> states;  // held -> state
};

/// What a rank keeps of a parameter's state: the whole state's shape and this rank's options, and
/// the box of it kept (offsets and sizes in box dimensions, a 0-d tensor's being one row; no
/// offsets: all of it). FSDP keeps its shard's rows, tensor parallelism its piece.
struct HeldPiece {
  std::vector<int64_t> shape;
  at::TensorOptions options;
  std::vector<int64_t> offsets, sizes;
  bool whole() const { return offsets.empty(); }
};

/// Reads the state of the parameters in `held` from `files` (the optimizer's safetensors files,
/// already verified against the manifest; whole or sharded, Note [Sharded files]) and
/// checks it against `description` and this optimizer (type, groups, names, shapes, every file's
/// tensors naming one of its parameters, none twice). `held_piece` says what of each parameter's
/// state to keep (default: all of it, the parameter's shape). With `pipeline` (a pipeline's
/// checkpoint, or a pipeline loading one) each of this optimizer's groups need only be among the
/// saved group's parameters (a stage holds some of them). Throws tandem::Error, one line naming
/// the file, and changes nothing.
StagedOptimizerState stage_optimizer_state(const torch::optim::Optimizer& optimizer,
                                           const std::vector<std::vector<at::Tensor>>& groups,
                                           const ParamNames& names, const std::vector<at::Tensor>& held,
                                           const nlohmann::json& description,
                                           const std::vector<std::string>& files, const std::string& where,
                                           const std::function<HeldPiece(const at::Tensor&)>& held_piece = nullptr,
                                           bool pipeline = false);

/// Sets the groups' hyper-parameters (checked by stage_optimizer_state).
void apply_optimizer_options(torch::optim::Optimizer& optimizer, const std::vector<nlohmann::json>& options);

/// Sets the groups' hyper-parameters and replaces the state of every parameter in `held` (none
/// for one the checkpoint holds no state for).
void apply_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& held,
                           StagedOptimizerState staged);

}  // namespace tandem::accelerate
