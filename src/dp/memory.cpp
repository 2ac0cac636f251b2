#include "tandem/dp/memory.h"

#include <algorithm>
#include <cstdio>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace tandem::dp {

namespace {

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

std::string megabytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f MB", bytes / 1e6);
  return text;
}

}  // namespace

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (const auto& [key, state] : optimizer.state()) {
    (void)key;
    if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
      total += bytes_of(s->momentum_buffer());
    } else if (auto* a = dynamic_cast<const torch::optim::AdamParamState*>(state.get())) {
      total += bytes_of(a->exp_avg()) + bytes_of(a->exp_avg_sq()) + bytes_of(a->max_exp_avg_sq());
    } else if (auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
      total += bytes_of(w->exp_avg()) + bytes_of(w->exp_avg_sq()) + bytes_of(w->max_exp_avg_sq());
    } else if (auto* r = dynamic_cast<const torch::optim::RMSpropParamState*>(state.get())) {
      total += bytes_of(r->square_avg()) + bytes_of(r->momentum_buffer()) + bytes_of(r->grad_avg());
    } else if (auto* g = dynamic_cast<const torch::optim::AdagradParamState*>(state.get())) {
      total += bytes_of(g->sum());
    }
  }
  return total;
}

int64_t DeviceMemory::total() const {
  if (device_peak_bytes) return *device_peak_bytes;  // it holds the rest: Note [DataParallel memory accounting]
  return parameter_bytes + gradient_bytes + optimizer_bytes + (activations_tracked ? activation_peak_bytes : 0);
}

void DeviceMemory::derive_activations() {
  if (!device_peak_bytes) return;
  activation_peak_bytes = std::max<int64_t>(0, *device_peak_bytes - parameter_bytes - gradient_bytes - optimizer_bytes);
}

void MemoryReport::add_optimizer(const torch::optim::Optimizer& optimizer) {
  if (replicas.empty()) return;
  replicas.front().optimizer_bytes += optimizer_state_bytes(optimizer);
  replicas.front().derive_activations();
}

std::string MemoryReport::describe() const {
  std::string out;
  for (const auto& r : replicas) {
    out += "replica " + std::to_string(r.replica) + " (" + r.device.str() + "): parameters " +
           megabytes(r.parameter_bytes) + ", gradients " + megabytes(r.gradient_bytes) + ", activations " +
           (r.activations_tracked ? megabytes(r.activation_peak_bytes) : std::string("not tracked")) + ", optimizer " + megabytes(r.optimizer_bytes) + ", total " +
           megabytes(r.total()) + (r.device_peak_bytes ? " (the device's peak)" : "") + "\n";
  }
  return out;
}

}  // namespace tandem::dp
