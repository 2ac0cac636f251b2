#pragma once
// GradScaler: dynamic loss scaling for fp16 training, PyTorch's torch.amp.GradScaler in C++
// (LibTorch has autocast but no scaler: pytorch/pytorch#44710, #46649).
//
// The loss is multiplied by the scale before backward so that small fp16 gradients do not
// flush to zero; before the optimizer steps, the gradients are divided by the scale again and
// checked for inf/NaN. A step with any inf/NaN is skipped and the scale halved; after
// growth_interval finite steps in a row the scale doubles (Note [Scale update rule]).
//
// Example (one optimizer; clipping needs the unscaled gradients, so unscale() comes first):
//   tandem::amp::GradScaler scaler;                      // or GradScaler(pg) under DDP
//   for (auto& batch : loader) {
//     optimizer.zero_grad();
//     at::Tensor loss;
//     {
//       tandem::amp::AutocastScope autocast(c10::kCUDA, at::kHalf);
//       loss = loss_fn(model->forward(batch.data), batch.target);
//     }
//     scaler.scale(loss).backward();
//     scaler.unscale(optimizer);                         // optional: only to inspect or clip
//     torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
//     scaler.step(optimizer);                            // skipped when a gradient is inf/NaN
//     scaler.update();
//   }
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim
namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize
namespace tandem::comm {
class ProcessGroup;
}  // namespace tandem::comm

namespace tandem::amp {

// PyTorch's defaults (torch/amp/grad_scaler.py).
constexpr double kDefaultInitScale = 65536.0;  // 2**16
constexpr double kDefaultGrowthFactor = 2.0;
constexpr double kDefaultBackoffFactor = 0.5;
constexpr int64_t kDefaultGrowthInterval = 2000;

/// Options of GradScaler, with torch.amp.GradScaler's names and defaults.
///
/// Example:
///   auto options = tandem::amp::GradScalerOptions().init_scale(1024).growth_interval(100);
struct GradScalerOptions {
  /// The scale before the first update (rounded to float32, where the scale lives).
  TORCH_ARG(double, init_scale) = kDefaultInitScale;
  /// Multiplies the scale after growth_interval consecutive steps without inf/NaN; > 1.
  TORCH_ARG(double, growth_factor) = kDefaultGrowthFactor;
  /// Multiplies the scale after a step with inf/NaN; in (0, 1).
  TORCH_ARG(double, backoff_factor) = kDefaultBackoffFactor;
  /// Consecutive finite steps before the scale grows; >= 1.
  TORCH_ARG(int64_t, growth_interval) = kDefaultGrowthInterval;
  /// When false, scale() returns its input, step() always steps, and the rest does nothing.
  TORCH_ARG(bool, enabled) = true;
};

/// The scaler's state with PyTorch's state_dict() keys: plain values, so a checkpoint can store
/// them anywhere (JSON, a torch::serialize archive). Take it after update().
struct GradScalerState {
  /// False when saved from a disabled scaler (PyTorch's empty state_dict): an enabled scaler
  /// refuses to load it.
  bool enabled = true;
  double scale = kDefaultInitScale;                 // "scale"
  double growth_factor = kDefaultGrowthFactor;      // "growth_factor"
  double backoff_factor = kDefaultBackoffFactor;    // "backoff_factor"
  int64_t growth_interval = kDefaultGrowthInterval;  // "growth_interval"
  int64_t growth_tracker = 0;                       // "_growth_tracker": consecutive finite steps
};

/// Where an optimizer is in the current iteration (PyTorch's OptState).
enum class OptState { Ready, Unscaled, Stepped };

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  /// With a process group, unscale() all-reduces (MAX) whether any rank found inf/NaN, so every
  /// rank skips the same steps and keeps the same scale even when gradients are not synced.
  /// Every rank must then call unscale()/step() for the same optimizers in the same order.
  explicit GradScaler(std::shared_ptr<comm::ProcessGroup> process_group, GradScalerOptions options = {});
  // Not copyable: a copy would share the scale tensor. Movable.
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  /// `loss * scale`, the scale on loss's device (created there on first use). Returns `loss`
  /// itself when disabled.
  at::Tensor scale(const at::Tensor& loss);

  /// Divides the optimizer's gradients by the scale in place and records whether any is inf/NaN
  /// (all-reduced across ranks with a process group). At most once per optimizer between
  /// update()s, after the last backward that accumulates into the gradients: a second call
  /// throws (it would divide twice). Throws for fp16 gradients, as PyTorch does.
  void unscale(torch::optim::Optimizer& optimizer);

  /// Unscales if unscale() was not called for this optimizer since update(), then runs
  /// optimizer.step() unless a gradient was inf/NaN (on any rank). Returns whether it stepped.
  /// At most once per optimizer between update()s.
  bool step(torch::optim::Optimizer& optimizer);

  /// The new scale from the inf/NaN found by every optimizer stepped since the last update
  /// (Note [Scale update rule]); then every optimizer is Ready again. Once per iteration, after
  /// step() for every optimizer.
  void update();
  /// Sets the scale to `new_scale` (keeps the growth tracker), then every optimizer is Ready.
  void update(double new_scale);

  /// The current scale (init_scale before the first scale()); 1.0 when disabled.
  double get_scale() const;
  /// Consecutive steps without inf/NaN since the last growth or backoff; 0 when disabled.
  int64_t growth_tracker() const;
  double growth_factor() const { return options_.growth_factor(); }
  double backoff_factor() const { return options_.backoff_factor(); }
  int64_t growth_interval() const { return options_.growth_interval(); }
  bool is_enabled() const { return options_.enabled(); }
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return process_group_; }
  /// Where `optimizer` is since the last update(): Ready, Unscaled or Stepped.
  OptState state_of(const torch::optim::Optimizer& optimizer) const;

  /// The state to checkpoint (after update()); PyTorch's state_dict().
  GradScalerState state_dict() const;
  /// Restores the state; a disabled scaler ignores it, as in PyTorch. Throws for a state saved
  /// from a disabled scaler or with out-of-range factors.
  void load_state_dict(const GradScalerState& state);
  /// The same state as entries of a torch::serialize archive, under PyTorch's key names.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  struct PerOptimizer {
    OptState stage = OptState::Ready;
    // found_inf of each device holding gradients (PyTorch's found_inf_per_device), and their
    // sum on the scale's device after the all-reduce across ranks.
    std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;
    at::Tensor found_inf;
    // Whether any rank had gradients to check: a ZeRO-sharded optimizer may own none here.
    bool checked = false;
  };

  void check_started(const char* method) const;
  void init_scale_and_tracker(const c10::Device& device);
  std::vector<std::pair<c10::Device, at::Tensor>> unscale_grads(torch::optim::Optimizer& optimizer,
                                                               const at::Tensor& inv_scale,
                                                               const at::Tensor& found_inf) const;

  GradScalerOptions options_;
  std::shared_ptr<comm::ProcessGroup> process_group_;
  // Created on the loss's device by the first scale() (float32 and int32 0-dim, as in PyTorch);
  // until then get_scale()/growth_tracker() report init values.
  at::Tensor scale_;
  at::Tensor growth_tracker_;
  int64_t init_growth_tracker_ = 0;
  // Keyed by address, as PyTorch keys by id(optimizer).
  std::map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

/// `optimizer`'s step through `scaler` when there is one (which may skip it), else a plain step.
/// Returns whether it stepped.
bool step_optimizer(torch::optim::Optimizer& optimizer, GradScaler* scaler);

}  // namespace tandem::amp
