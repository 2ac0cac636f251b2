#include "tandem/dp/data_parallel.h"

#include <algorithm>
#include <mutex>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/parallel/data_parallel.h>

#include "dp/cuda_memory.h"
#include "dp/replica_threads.h"
#include "tandem/comm/cuda_info.h"
#include "tandem/comm/process_group.h"
#include "common/ready_hook.h"
#include "tandem/error.h"

namespace tandem::dp::detail {
namespace {

std::vector<c10::Device> checked_devices(std::vector<c10::Device> devices) {
  const int gpus = comm::cuda_device_count();
  if (devices.empty()) throw Error("DataParallel: the device list is empty");
  for (size_t i = 0; i < devices.size(); ++i) {
    const auto& d = devices[i];
    if (!d.is_cpu() && !d.is_cuda()) {
      throw Error("DataParallel: device " + d.str() + " is not supported: use cpu or cuda devices");
    }
    if (d.is_cuda()) {
      if (!d.has_index()) throw Error("DataParallel: device cuda needs an index (cuda:0, cuda:1, ...)");
      for (size_t j = 0; j < i; ++j) {
        if (devices[j] == d) {
          throw Error("DataParallel: device " + d.str() +
                      " appears twice: each GPU holds one replica (only the cpu may repeat)");
        }
      }
    }
  }
  for (const auto& d : devices) {
    if (d.is_cuda() && d.index() >= gpus) {
      throw Error("DataParallel: device " + d.str() + " does not exist (" + std::to_string(gpus) +
                  " CUDA devices visible)");
    }
  }
  return devices;
}

std::vector<c10::Device> default_devices() {
  const int gpus = comm::cuda_device_count();
  std::vector<c10::Device> devices;
  for (int i = 0; i < gpus; ++i) devices.emplace_back(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(i));
  if (devices.empty()) devices = {c10::Device(c10::kCPU), c10::Device(c10::kCPU)};
  return devices;
}

void copy_state(torch::nn::Module& from, torch::nn::Module& to, bool parameters) {
  at::NoGradGuard no_grad;
  if (parameters) {
    auto a = from.parameters(), b = to.parameters();
    for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  auto ba = from.buffers(), bb = to.buffers();
  for (size_t i = 0; i < ba.size(); ++i) bb[i].copy_(ba[i]);
}

// at::set_num_threads also resizes process-wide pools: replica threads take turns. With
// OpenMP the count itself is per thread, which is what gives each replica its own share.
void set_intra_op_threads(int n) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (at::get_num_threads() != n) at::set_num_threads(n);
}

int64_t parameter_bytes(torch::nn::Module& m) {
  int64_t total = 0;
  for (const auto& p : m.parameters()) total += p.numel() * static_cast<int64_t>(p.element_size());
  return total;
}

}  // namespace

DpCore::DpCore(std::shared_ptr<torch::nn::Module> primary, DataParallelOptions options, Forward forward,
               Factory factory)
    : primary_(std::move(primary)), options_(std::move(options)), forward_(std::move(forward)),
      factory_(std::move(factory)) {
  options_.devices(checked_devices(options_.devices() ? *options_.devices() : default_devices()));
  if (!options_.output_device()) options_.output_device(options_.devices()->front());
  checked_devices({*options_.output_device()});
  if (options_.threads_per_replica() < 0) throw Error("DataParallel: threads_per_replica must be >= 0");

  const auto& devices = *options_.devices();
  primary_->to(devices.front());
  if (options_.track_cpu_memory()) memory_ = std::make_unique<MemoryTracker>(devices.size());
  replicas_ = {primary_};
  if (options_.mode() == Mode::Persistent) {
    for (size_t k = 1; k < devices.size(); ++k) replicas_.push_back(make_replica(devices[k]));
    // Each replica's gradients are summed into the primary's once its backward has run.
    for (size_t k = 1; k < replicas_.size(); ++k) {
      for (auto& p : replicas_[k]->parameters()) {
        if (!p.requires_grad()) continue;
        auto accumulator = torch::autograd::impl::grad_accumulator(p);
        auto key = accumulator->add_post_hook(std::make_unique<tandem::detail::ReadyHook>([this] { arm_gradient_reduction(); }));
        hooks_.emplace_back(std::move(accumulator), key);
      }
    }
  }
}

DpCore::~DpCore() {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
}

std::shared_ptr<torch::nn::Module> DpCore::make_replica(const c10::Device& device) const {
  std::shared_ptr<torch::nn::Module> replica;
  if (factory_) {
    replica = factory_();
    replica->to(device);
    if (replica->parameters().size() != primary_->parameters().size() ||
        replica->buffers().size() != primary_->buffers().size()) {
      throw Error("DataParallel: make_replica built a module with a different number of parameters or buffers");
    }
    copy_state(*primary_, *replica, /*parameters=*/true);
    return replica;
  }
  try {
    return primary_->clone(device);
  } catch (const c10::Error& e) {
    throw Error("DataParallel: cannot copy " + primary_->name() + " to " + device.str() +
                ": derive it from torch::nn::Cloneable<" + primary_->name() +
                "> (and implement reset()), or pass a make_replica function");
  }
}

void DpCore::sync_persistent_replicas() {
  // Every forward copies the primary's parameters and buffers out (Note [DataParallel buffers]).
  // A version-counter shortcut would skip unchanged parameters, but LibTorch's optimizers update
  // parameters without moving it, so the copy is unconditional: one memcpy of the model per
  // replica, where Replicate mode also rebuilds the module and its autograd edges.
  at::NoGradGuard no_grad;
  for (size_t k = 1; k < replicas_.size(); ++k) copy_state(*primary_, *replicas_[k], /*parameters=*/true);
}

void DpCore::arm_gradient_reduction() {
  if (!reduction_armed_ || reduction_queued_.exchange(true)) return;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { reduce_gradients(); });
}

void DpCore::reduce_gradients() {
  at::NoGradGuard no_grad;
  auto primary_params = primary_->parameters();
  for (size_t k = 1; k < replicas_.size(); ++k) {
    auto params = replicas_[k]->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& g = params[i].mutable_grad();
      if (!g.defined()) continue;
      at::Tensor& total = primary_params[i].mutable_grad();
      at::Tensor here = g.to(primary_params[i].device());
      if (total.defined()) {
        total.add_(here);
      } else {
        total = here.is_same(g) ? here.clone() : here;
      }
      g.reset();
    }
  }
  reduction_armed_ = false;
  reduction_queued_ = false;
}

at::Tensor DpCore::forward(const at::Tensor& input) {
  if (!input.defined() || input.dim() == 0) throw Error("DataParallel: the input needs a batch dimension (dim 0)");
  if (input.size(0) == 0) throw Error("DataParallel: the batch is empty");
  const auto& devices = *options_.devices();
  std::vector<at::Tensor> chunks = input.chunk(static_cast<int64_t>(devices.size()), 0);
  const size_t used = chunks.size();
  last_used_ = used;

  std::vector<std::shared_ptr<torch::nn::Module>> replicas{primary_};
  if (options_.mode() == Mode::Replicate) {
    std::vector<std::shared_ptr<torch::nn::Module>> copies;
    std::vector<c10::Device> copy_devices;
    for (size_t k = 1; k < used; ++k) {
      copies.push_back(make_replica(devices[k]));  // counted as parameter bytes, not activations
      copy_devices.push_back(devices[k]);
    }
    // Autograd edges from every copy's parameters back to the primary's (LibTorch's ReduceAdd).
    if (!copies.empty()) torch::nn::replicate_grad_edges(primary_, copies, copy_devices);
    replicas.insert(replicas.end(), copies.begin(), copies.end());
  } else {
    sync_persistent_replicas();
    replicas.assign(replicas_.begin(), replicas_.begin() + static_cast<std::ptrdiff_t>(used));
    // A backward that raised never summed its replica gradients: they must not leak into this one.
    for (size_t k = 1; k < replicas_.size(); ++k) {
      for (auto& p : replicas_[k]->parameters()) p.mutable_grad().reset();
    }
    reduction_armed_ = at::GradMode::is_enabled();
    reduction_queued_ = false;
  }

  // Each CPU replica gets its share of the intra-op threads.
  const int total_threads = at::get_num_threads();
  const size_t cpu_replicas = static_cast<size_t>(std::count_if(
      devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(used), [](const c10::Device& d) { return d.is_cpu(); }));
  const int share = options_.threads_per_replica() > 0
                        ? options_.threads_per_replica()
                        : std::max(1, total_threads / static_cast<int>(std::max<size_t>(cpu_replicas, 1)));

  std::vector<at::Tensor> outputs(used);
  std::vector<std::string> errors(used);
  const at::ThreadLocalState caller_state;  // grad mode, autocast, ... as the caller has them
  auto run = [&](size_t k) {
    try {
      at::ThreadLocalStateGuard state(caller_state);
      std::optional<MemoryTracker::Scope> attribute;
      if (memory_) attribute.emplace(*memory_, k);
      if (devices[k].is_cpu()) set_intra_op_threads(share);
      at::Tensor chunk = chunks[k].to(devices[k]);
      outputs[k] = forward_(*replicas[k], chunk);
    } catch (const std::exception& e) {
      errors[k] = one_line(e);
    } catch (...) {
      errors[k] = "unknown exception";
    }
  };
  run_replicas(used, run);
  set_intra_op_threads(total_threads);
  for (size_t k = 0; k < used; ++k) {
    if (!errors[k].empty()) {
      throw Error("DataParallel: replica " + std::to_string(k) + " on " + devices[k].str() + " failed: " + errors[k]);
    }
  }
  std::optional<MemoryTracker::Scope> attribute;
  if (memory_) attribute.emplace(*memory_, 0);
  std::vector<at::Tensor> gathered;
  gathered.reserve(used);
  for (auto& out : outputs) gathered.push_back(out.to(*options_.output_device()));
  return used == 1 ? gathered.front() : at::cat(gathered, 0);
}

MemoryReport DpCore::memory_report() const {
  MemoryReport report;
  const int64_t params = parameter_bytes(*primary_);
  const auto& devices = *options_.devices();
  for (size_t k = 0; k < devices.size(); ++k) {
    DeviceMemory m;
    m.replica = k;
    m.device = devices[k];
    const bool took_part = k < std::max<size_t>(last_used_, 1);
    // Every replica that took part held a full copy of the parameters and, during backward, of
    // the gradients (Note [DataParallel memory accounting]).
    m.parameter_bytes = took_part ? params : 0;
    m.gradient_bytes = took_part ? params : 0;
    if (devices[k].is_cuda()) {
      m.activation_peak_bytes = cuda_peak_allocated_bytes(devices[k].index());
    } else if (memory_) {
      m.activation_peak_bytes = memory_->peak(k);
    } else {
      m.activations_tracked = false;
    }
    report.replicas.push_back(m);
  }
  return report;
}

void DpCore::reset_memory_peaks() {
  if (memory_) memory_->reset_peaks();
  for (const auto& d : *options_.devices()) {
    if (d.is_cuda()) cuda_reset_peak(d.index());
  }
}

}  // namespace tandem::dp::detail
