#include "tandem/amp/grad_scaler.h"

#include <cmath>
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include "tandem/comm/process_group.h"
#include "tandem/error.h"

// Note [Scale update rule]: PyTorch's, by calling the same kernels PyTorch's GradScaler calls,
// so the scale sequence is bit-identical (tests/oracles/grad_scaler.json):
//   - unscale: inv_scale = float32(1 / double(scale)); the gradients, grouped by device and
//     dtype, go through at::_amp_foreach_non_finite_check_and_unscale_, which multiplies them by
//     inv_scale and sets found_inf to 1 when any value is inf/NaN;
//   - step: optimizer.step() unless this optimizer's found_inf is non-zero;
//   - update: found_inf summed over every optimizer unscaled since the last update, then
//     at::_amp_update_scale_: if found_inf, scale *= backoff_factor and the tracker resets to 0;
//     else the tracker counts up, and on reaching growth_interval the scale *= growth_factor
//     (only if the product is finite) and the tracker resets to 0.
//
// Note [Found inf across ranks]: with a process group, unscale() all-reduces (MAX) the
// optimizer's found_inf right after the check, before anything reads it. step() and update()
// read only that reduced value, so every rank skips the same steps and computes the same scale.
// Under DDP the gradients are already averaged (an inf anywhere is an inf everywhere), but with
// unsynced gradients (no_sync, DataParallel replicas, a user's own all-reduce) only the
// all-reduce makes it certain. It costs one 12-byte all-reduce per optimizer per step; step()
// reads the value on the host anyway, as PyTorch's does. The second value says whether this rank
// had gradients at all: under ZeRO a rank may own none of an optimizer's parameters, and the
// "no gradients" error is about every rank, not one. The third, whether it refused a gradient:
// then every rank throws, none waits.

namespace tandem::amp {
namespace {

void check_options(const char* where, double growth_factor, double backoff_factor, int64_t growth_interval) {
  TANDEM_CHECK(growth_factor > 1.0, where, ": growth_factor ", growth_factor, " must be > 1.0");
  TANDEM_CHECK(backoff_factor > 0.0 && backoff_factor < 1.0, where, ": backoff_factor ", backoff_factor,
               " must be in (0, 1)");
  TANDEM_CHECK(growth_interval >= 1, where, ": growth_interval ", growth_interval, " must be >= 1");
}

void check_scale(const char* where, const char* name, double scale) {
  TANDEM_CHECK(std::isfinite(scale) && scale > 0.0, where, ": ", name, " ", scale, " must be finite and > 0");
}

at::Tensor on_device(std::vector<std::pair<c10::Device, at::Tensor>>& copies, const at::Tensor& master,
                     const c10::Device& device) {
  for (auto& [d, t] : copies) {
    if (d == device) return t;
  }
  // A copy even on master's own device, as PyTorch's _MultiDeviceReplicator makes.
  copies.emplace_back(device, master.to(device, /*non_blocking=*/true, /*copy=*/true));
  return copies.back().second;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : GradScaler(nullptr, options) {}

GradScaler::GradScaler(std::shared_ptr<comm::ProcessGroup> process_group, GradScalerOptions options)
    : options_(options), process_group_(std::move(process_group)) {
  if (options_.enabled()) {
    check_options("GradScaler", options_.growth_factor(), options_.backoff_factor(), options_.growth_interval());
    check_scale("GradScaler", "init_scale", options_.init_scale());
  }
}

void GradScaler::check_started(const char* method) const {
  TANDEM_CHECK(scale_.defined(), "GradScaler::", method,
               " called before scale(): call scaler.scale(loss).backward() earlier in the iteration");
}

void GradScaler::init_scale_and_tracker(const c10::Device& device) {
  scale_ = at::full({}, options_.init_scale(), at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::full({}, init_growth_tracker_, at::TensorOptions().dtype(at::kInt).device(device));
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled()) return loss;
  TANDEM_CHECK(loss.defined(), "GradScaler::scale: the loss is an undefined tensor");
  if (!scale_.defined()) init_scale_and_tracker(loss.device());
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

std::vector<std::pair<c10::Device, at::Tensor>> GradScaler::unscale_grads(torch::optim::Optimizer& optimizer,
                                                                          const at::Tensor& inv_scale,
                                                                          const at::Tensor& found_inf) const {
  // Split the gradients by device, then dtype, in first-seen order (PyTorch's defaultdicts).
  struct DeviceGroup {
    c10::Device device;
    std::vector<std::pair<at::ScalarType, std::vector<at::Tensor>>> by_dtype;
  };
  std::vector<DeviceGroup> groups;
  at::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      TANDEM_CHECK(grad.scalar_type() != at::kHalf,
                   "GradScaler::unscale: a gradient is float16: attempting to unscale FP16 gradients; keep the "
                   "parameters in float32 and let autocast run the ops in float16");
      // A sparse gradient's values (PyTorch checks the values of the coalesced gradient only for
      // float16, refused above).
      at::Tensor to_unscale = grad.is_sparse() ? grad._values() : grad;
      DeviceGroup* dg = nullptr;
      for (auto& g : groups) {
        if (g.device == to_unscale.device()) dg = &g;
      }
      if (!dg) dg = &groups.emplace_back(DeviceGroup{to_unscale.device(), {}});
      std::vector<at::Tensor>* list = nullptr;
      for (auto& [dtype, tensors] : dg->by_dtype) {
        if (dtype == to_unscale.scalar_type()) list = &tensors;
      }
      if (!list) list = &dg->by_dtype.emplace_back(to_unscale.scalar_type(), std::vector<at::Tensor>{}).second;
      list->push_back(to_unscale);
    }
  }
  std::vector<std::pair<c10::Device, at::Tensor>> inv_scales;
  std::vector<std::pair<c10::Device, at::Tensor>> found_infs;
  for (auto& g : groups) {
    at::Tensor device_found_inf = on_device(found_infs, found_inf, g.device);
    const at::Tensor device_inv_scale = on_device(inv_scales, inv_scale, g.device);
    for (auto& [dtype, tensors] : g.by_dtype) {
      at::_amp_foreach_non_finite_check_and_unscale_(tensors, device_found_inf, device_inv_scale);
    }
  }
  return found_infs;
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  check_started("unscale");
  PerOptimizer& state = per_optimizer_[&optimizer];
  TANDEM_CHECK(state.stage != OptState::Unscaled,
               "GradScaler::unscale: already called for this optimizer since the last update(): unscale once per "
               "iteration, after the last backward and before clipping (a second call would divide the gradients "
               "twice)");
  TANDEM_CHECK(state.stage != OptState::Stepped,
               "GradScaler::unscale: called after step() for this optimizer: unscale before step(), or call "
               "update() to start the next iteration");
  // The reciprocal in double, as PyTorch does: float32 division can be imprecise.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  const at::Tensor found_inf = at::zeros({}, scale_.options().dtype(at::kFloat));
  // A refused gradient (float16) is refused on every rank together: with a sharded optimizer only
  // its owner sees it, and the others must not wait for it in the all-reduce below.
  std::string refused;
  try {
    state.found_inf_per_device = unscale_grads(optimizer, inv_scale, found_inf);
  } catch (const Error& e) {
    if (!process_group_) throw;
    refused = e.what();
  }

  // Note [Found inf across ranks]
  at::Tensor combined = at::zeros({3}, scale_.options().dtype(at::kFloat));
  for (auto& [device, t] : state.found_inf_per_device) combined[0].add_(t.to(scale_.device(), /*non_blocking=*/true));
  if (!state.found_inf_per_device.empty()) combined[1].fill_(1);
  if (!refused.empty()) combined[2].fill_(1);
  if (process_group_) process_group_->all_reduce(combined, comm::ReduceOp::Max);
  const at::Tensor flags = combined.cpu();  // one read on the host for both flags
  TANDEM_CHECK(flags[2].item<float>() == 0,
               refused.empty() ? "GradScaler::unscale: another rank refused one of its gradients (its log says why)"
                               : refused);
  state.found_inf = combined[0].clone();
  state.checked = flags[1].item<float>() > 0;
  state.stage = OptState::Unscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  check_started("step");
  PerOptimizer& state = per_optimizer_[&optimizer];
  TANDEM_CHECK(state.stage != OptState::Stepped,
               "GradScaler::step: already called for this optimizer since the last update(): call update() once "
               "per iteration, after step() for every optimizer");
  if (state.stage == OptState::Ready) unscale(optimizer);
  TANDEM_CHECK(state.checked,
               "GradScaler::step: the optimizer has no gradients to check: call scaler.scale(loss).backward() "
               "before step()");
  // Every rank reads the same reduced value here (Note [Found inf across ranks]).
  const bool finite = state.found_inf.item<float>() == 0.0f;
  if (finite) optimizer.step();
  state.stage = OptState::Stepped;
  return finite;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  check_started("update");
  // Every optimizer unscaled since the last update (on this rank): the found_inf it contributes
  // is the all-reduced one, so every rank combines the same values.
  at::Tensor combined;
  for (auto& [optimizer, state] : per_optimizer_) {
    if (!state.found_inf.defined()) continue;
    const at::Tensor t = state.found_inf.to(scale_.device(), /*non_blocking=*/true);
    combined = combined.defined() ? combined + t : t.clone();
  }
  TANDEM_CHECK(combined.defined(),
               "GradScaler::update: no optimizer was unscaled or stepped since the last update(): call "
               "scaler.step(optimizer) before update()");
  at::_amp_update_scale_(scale_, growth_tracker_, combined, options_.growth_factor(), options_.backoff_factor(),
                         options_.growth_interval());
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled()) return;
  check_started("update");
  check_scale("GradScaler::update", "new_scale", new_scale);
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale();
}

int64_t GradScaler::growth_tracker() const {
  if (!options_.enabled()) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

OptState GradScaler::state_of(const torch::optim::Optimizer& optimizer) const {
  auto it = per_optimizer_.find(&optimizer);
  return it == per_optimizer_.end() ? OptState::Ready : it->second.stage;
}

GradScalerState GradScaler::state_dict() const {
  GradScalerState state;
  state.enabled = options_.enabled();
  state.scale = get_scale();
  state.growth_factor = options_.growth_factor();
  state.backoff_factor = options_.backoff_factor();
  state.growth_interval = options_.growth_interval();
  state.growth_tracker = growth_tracker();
  return state;
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  if (!options_.enabled()) return;
  const char* where = "GradScaler::load_state_dict";
  TANDEM_CHECK(state.enabled, where,
               ": the state was saved from a disabled GradScaler (PyTorch's empty state_dict): there is no scale "
               "to restore");
  check_options(where, state.growth_factor, state.backoff_factor, state.growth_interval);
  check_scale(where, "scale", state.scale);
  TANDEM_CHECK(state.growth_tracker >= 0 && state.growth_tracker < state.growth_interval, where, ": _growth_tracker ",
               state.growth_tracker, " must be in [0, growth_interval ", state.growth_interval, ")");
  options_.init_scale(state.scale);
  options_.growth_factor(state.growth_factor);
  options_.backoff_factor(state.backoff_factor);
  options_.growth_interval(state.growth_interval);
  init_growth_tracker_ = state.growth_tracker;
  if (scale_.defined()) scale_.fill_(state.scale);
  if (growth_tracker_.defined()) growth_tracker_.fill_(state.growth_tracker);
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  const GradScalerState state = state_dict();
  archive.write("enabled", c10::IValue(state.enabled));
  archive.write("scale", c10::IValue(state.scale));
  archive.write("growth_factor", c10::IValue(state.growth_factor));
  archive.write("backoff_factor", c10::IValue(state.backoff_factor));
  archive.write("growth_interval", c10::IValue(state.growth_interval));
  archive.write("_growth_tracker", c10::IValue(state.growth_tracker));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  auto read = [&](const char* key) {
    c10::IValue value;
    TANDEM_CHECK(archive.try_read(key, value), "GradScaler::load: the archive has no '", key,
                 "' entry: expected one written by GradScaler::save");
    return value;
  };
  auto read_double = [&](const char* key) {
    const c10::IValue value = read(key);
    TANDEM_CHECK(value.isDouble(), "GradScaler::load: '", key, "' is a ", value.tagKind(), ", expected a float");
    return value.toDouble();
  };
  auto read_int = [&](const char* key) {
    const c10::IValue value = read(key);
    TANDEM_CHECK(value.isInt(), "GradScaler::load: '", key, "' is a ", value.tagKind(), ", expected an int");
    return value.toInt();
  };
  const c10::IValue enabled = read("enabled");
  TANDEM_CHECK(enabled.isBool(), "GradScaler::load: 'enabled' is a ", enabled.tagKind(), ", expected a bool");
  GradScalerState state;
  state.enabled = enabled.toBool();
  state.scale = read_double("scale");
  state.growth_factor = read_double("growth_factor");
  state.backoff_factor = read_double("backoff_factor");
  state.growth_interval = read_int("growth_interval");
  state.growth_tracker = read_int("_growth_tracker");
  load_state_dict(state);
}

bool step_optimizer(torch::optim::Optimizer& optimizer, GradScaler* scaler) {
  if (scaler) return scaler->step(optimizer);
  optimizer.step();
  return true;
}

}  // namespace tandem::amp
