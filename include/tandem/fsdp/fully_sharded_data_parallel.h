#pragma once
// FullyShardedDataParallel (ZeRO-3): every rank keeps 1/W of every parameter, gathers a unit's
// parameters just before the unit runs (forward, and again for its backward), frees them after,
// and reduce-scatters its gradients as soon as they exist (docs/guide-fsdp.md,
// docs/design/fsdp.md, Note [FSDP schedule] in src/fsdp/engine.cpp).
//
//   auto pg = tandem::comm::ProcessGroup::create(tandem::comm::World::from_env());
//   auto net = torch::nn::Sequential(Block(), Block(), Block(), torch::nn::Linear(64, 10));
//   tandem::fsdp::wrap_entries(*net);                     // units: each entry (auto_wrap.h)
//   tandem::fsdp::FullyShardedDataParallel model(net, pg);
//   torch::optim::AdamW opt(model->shard_parameters(), torch::optim::AdamWOptions(1e-3));
//   auto loss = torch::nll_loss(model->forward(x), y);
//   loss.backward();                                      // gradients land on the shards
//   opt.step();                                           // steps this rank's shards only
//   opt.zero_grad();
//
// HSDP (shards within a node, replicas across nodes): pass a 2-D mesh {"replicate", "shard"}.
//   tandem::comm::DeviceMesh mesh(pg, {nodes, gpus_per_node}, {"replicate", "shard"});
//   tandem::fsdp::FullyShardedDataParallel model(net, mesh);
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include "tandem/comm/device_mesh.h"
#include "tandem/comm/process_group.h"
#include "tandem/fsdp/auto_wrap.h"
#include "tandem/fsdp/engine.h"
#include "tandem/fsdp/forward_cast.h"
#include "tandem/fsdp/options.h"
#include "tandem/fsdp/unit.h"
#include "tandem/nn/checkpoint_policy.h"
#include "tandem/output_tensors.h"

namespace tandem::fsdp {

/// While alive, backwards of forwards run inside it accumulate whole gradients on the parameters
/// instead of reduce-scattering (DDP's no_sync; FSDP2's set_requires_gradient_sync(False)).
class NoSyncGuard {
 public:
  explicit NoSyncGuard(detail::Engine& engine) : engine_(&engine), previous_(engine.sync()) { engine.set_sync(false); }
  ~NoSyncGuard() {
    if (engine_) engine_->set_sync(previous_);
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept : engine_(std::exchange(other.engine_, nullptr)), previous_(other.previous_) {}
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  detail::Engine* engine_;
  bool previous_;
};

namespace detail {
/// A mesh's shard group (its last dimension) and, for a 2-D mesh, `options` with its first
/// dimension as the replicate group (HSDP). A mesh of more dimensions is a one-line error.
std::pair<std::shared_ptr<comm::ProcessGroup>, FullyShardOptions> mesh_groups(const comm::DeviceMesh& mesh,
                                                                               FullyShardOptions options);
}  // namespace detail

/// Points an optimizer built on the model's parameters at their shards instead, in place (its
/// param groups and hyper-parameters stay). Before its first step; the state an optimizer makes
/// when it is made (Adagrad's: step 0, sum = initial_accumulator_value) is made again for the
/// shards. Throws tandem::Error for a parameter the model does not shard.
void shard_optimizer(torch::optim::Optimizer& optimizer, const ShardedParameters& shards);

template <typename ModuleHolder>
class FullyShardedDataParallelImpl : public torch::nn::Module {
 public:
  /// Shards `module`: its tandem::fsdp::Unit modules, and the root unit (its other parameters).
  /// Collective (with sync_module_states, rank 0's weights first reach every rank).
  FullyShardedDataParallelImpl(ModuleHolder module, std::shared_ptr<comm::ProcessGroup> pg, FullyShardOptions options = {})
      : torch::nn::Module("FullyShardedDataParallel"), module_(register_module("module", module)) {
    if (options.auto_wrap()) auto_wrap(*module_, *options.auto_wrap());
    if (options.activation_checkpointing()) nn::checkpoint_modules(*module_, *options.activation_checkpointing());
    engine_ = detail::Engine::create(*module_, std::move(pg), options);
  }
  /// Over a mesh: 1-D, FSDP over its group; 2-D ({replicate, shard}), HSDP (FullyShardOptions::
  /// replicate_group).
  FullyShardedDataParallelImpl(ModuleHolder module, const comm::DeviceMesh& mesh, FullyShardOptions options = {})
      : torch::nn::Module("FullyShardedDataParallel"), module_(register_module("module", module)) {
    if (options.auto_wrap()) auto_wrap(*module_, *options.auto_wrap());
    if (options.activation_checkpointing()) nn::checkpoint_modules(*module_, *options.activation_checkpointing());
    auto [shard, with_replicas] = detail::mesh_groups(mesh, std::move(options));
    engine_ = detail::Engine::create(*module_, std::move(shard), with_replicas);
  }

  /// Calls the wrapped module's forward with the root gathered; units gather themselves.
  template <typename... Args>
  auto forward(Args&&... args) {
    engine_->root_pre_forward();
    try {
      const auto dtype = engine_->input_dtype();
      auto output = module_->forward(detail::cast_argument(std::forward<Args>(args), dtype)...);
      detail::cast_output(output, engine_->output_dtype());
      std::vector<at::Tensor> tensors;
      const bool complete = tandem::detail::OutputTensors<decltype(output)>::collect(output, tensors);
      engine_->root_post_forward(tensors, complete);
      return output;
    } catch (...) {
      engine_->forward_failed(std::current_exception());
    }
  }

  /// Local accumulation while the returned guard lives (whole gradients, reduced at the next synced backward).
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*engine_); }
  /// Whether the next forwards' backwards reduce-scatter (FSDP2's set_requires_gradient_sync).
  void set_requires_gradient_sync(bool enabled) { engine_->set_sync(enabled); }
  /// Arms the next backward to reduce-scatter every gradient accumulated so far, as if its forward
  /// had been synced: for several forwards in flight (a pipeline stage), run them all without
  /// sync, then call this before the last backward (Note [Several forwards in flight]).
  void prepare_for_backward() { engine_->prepare_for_backward(); }

  /// What the optimizer steps: this rank's shard of every parameter.
  std::vector<at::Tensor> shard_parameters() const {
    std::vector<at::Tensor> out;
    for (auto& item : engine_->named_shards()) out.push_back(item.second);
    return out;
  }
  std::vector<std::pair<std::string, at::Tensor>> named_shard_parameters() const { return engine_->named_shards(); }
  /// Every parameter whole (copies), by name. Collective.
  std::vector<std::pair<std::string, at::Tensor>> gather_parameters() { return engine_->gather_parameters(); }
  /// torch.nn.utils.clip_grad_norm_ over every rank's shards; the same norm on every rank. Collective.
  double clip_grad_norm(double max_norm, double norm_type = 2.0) { return engine_->clip_grad_norm(max_norm, norm_type); }
  MemoryBytes memory() const { return engine_->memory(); }
  /// Host time blocked on the gathers and reduce-scatters so far: communication not hidden.
  CommWaits comm_waits() const { return engine_->comm_waits(); }
  std::vector<UnitInfo> units() const { return engine_->units(); }

  ModuleHolder& module() { return module_; }
  /// The shards, for what reads them from outside FSDP (layouts, checkpoints, FsdpOptimizer).
  std::shared_ptr<ShardedParameters> sharded_parameters() const { return engine_; }
  detail::Engine& engine() { return *engine_; }
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return engine_->process_group(); }

 private:
  ModuleHolder module_;
  std::shared_ptr<detail::Engine> engine_;
};

/// A module holder, like those TORCH_MODULE declares: `model->forward(x)`.
template <typename ModuleHolder>
class FullyShardedDataParallel : public torch::nn::ModuleHolder<FullyShardedDataParallelImpl<ModuleHolder>> {
 public:
  using torch::nn::ModuleHolder<FullyShardedDataParallelImpl<ModuleHolder>>::ModuleHolder;
};

template <typename ModuleHolder, typename... Rest>
FullyShardedDataParallel(ModuleHolder, Rest...) -> FullyShardedDataParallel<ModuleHolder>;

}  // namespace tandem::fsdp
