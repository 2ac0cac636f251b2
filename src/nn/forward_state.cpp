#include "nn/forward_state.h"

#include <algorithm>
#include <mutex>

#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include "tandem/nn/region_rng.h"

namespace tandem::nn::detail {
namespace {

at::Generator& generator(c10::Device device) {
  // The default generators live as long as the process; defaultGenerator gives a const handle to one.
  return const_cast<at::Generator&>(at::globalContext().defaultGenerator(device));
}

}  // namespace

RngStates RngStates::capture(const std::vector<c10::DeviceIndex>& cuda) {
  RngStates states;
  {
    at::Generator& cpu = generator(c10::Device(c10::kCPU));
    std::lock_guard<std::mutex> lock(cpu.mutex());
    states.cpu_ = cpu.get_state();
  }
  for (c10::DeviceIndex index : cuda) {
    at::Generator& gen = generator(c10::Device(c10::kCUDA, index));
    std::lock_guard<std::mutex> lock(gen.mutex());
    states.cuda_.emplace_back(index, gen.get_state());
  }
  states.region_ = region_rng_states();
  return states;
}

void RngStates::restore() const {
  if (cpu_.defined()) {
    at::Generator& cpu = generator(c10::Device(c10::kCPU));
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(cpu_);
  }
  for (const auto& [index, state] : cuda_) {
    at::Generator& gen = generator(c10::Device(c10::kCUDA, index));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
  if (!region_.empty()) set_region_rng_states(region_);
}

std::vector<c10::DeviceIndex> cuda_devices(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::DeviceIndex> out;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.is_cuda()) continue;
    const c10::DeviceIndex index = t.device().index();
    if (std::find(out.begin(), out.end(), index) == out.end()) out.push_back(index);
  }
  return out;
}

AutocastState AutocastState::capture() {
  AutocastState state;
  state.cpu_ = {at::autocast::is_autocast_enabled(c10::kCPU), at::autocast::get_autocast_dtype(c10::kCPU)};
  state.cuda_ = {at::autocast::is_autocast_enabled(c10::kCUDA), at::autocast::get_autocast_dtype(c10::kCUDA)};
  return state;
}

void AutocastState::apply() const {
  at::autocast::set_autocast_enabled(c10::kCPU, cpu_.enabled);
  at::autocast::set_autocast_dtype(c10::kCPU, cpu_.dtype);
  at::autocast::set_autocast_enabled(c10::kCUDA, cuda_.enabled);
  at::autocast::set_autocast_dtype(c10::kCUDA, cuda_.dtype);
}

AutocastGuard::AutocastGuard(const AutocastState& state) : previous_(AutocastState::capture()) {
  state.apply();
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // Casts cached while recomputing must not outlive it: the weights change at the next step.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  previous_.apply();
}

}  // namespace tandem::nn::detail
