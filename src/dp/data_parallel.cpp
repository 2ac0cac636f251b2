#include "tandem/dp/data_parallel.h"

#include <algorithm>
#include <mutex>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include "dp/cuda_memory.h"
#include "dp/replica_threads.h"
#include "tandem/comm/cuda_info.h"
#include "tandem/comm/process_group.h"
#include "common/cpu_memory_tracker.h"
#include "common/ready_hook.h"
#include "common/record_stream.h"
#include "tandem/error.h"
#include "tandem/host_allocator.h"

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

// A replica's parameters require grad where the primary's do, as they are now: a frozen
// parameter costs its replicas no gradient, and one unfrozen later gets them again. (A fresh
// module's parameters all require grad: clone() and factories run reset().)
void match_requires_grad(torch::nn::Module& primary, torch::nn::Module& replica) {
  auto mine = primary.parameters(), theirs = replica.parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    if (theirs[i].requires_grad() != mine[i].requires_grad()) theirs[i].requires_grad_(mine[i].requires_grad());
  }
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

// Note [DataParallel streams]
// CUDA work is ordered only by streams: a kernel runs after the earlier work of its own stream
// and of the events its stream waited on, whatever the host threads did. A new thread starts on
// device 0 and on every device's default stream, so each replica thread makes its device
// current and, as PyTorch's parallel_apply does, the caller's current stream of that device
// (CallerStreams, read on the caller's thread as forward starts). Each device then has one
// stream for the whole step, the caller's, and the order holds because:
// - the copies of state into the replicas (Persistent: sync_persistent_replicas; Replicate:
//   Module::clone) and of the chunks run on the caller's thread before any replica thread
//   starts. A cross-device copy_ is ordered with the current streams of both devices (ATen's
//   copy_device_to_device makes each wait for the other), so replica k's kernels, queued after
//   them on the caller's stream of its device, read the copied weights and input;
// - the gather runs on the caller's thread after the joins, on the same streams, so it reads
//   finished outputs (the join orders the queuing; the streams order the kernels);
// - backward ops run on the stream of their forward op. Persistent mode's reduce_gradients is a
//   final callback: the engine runs it with the backward caller's current streams current, once
//   they waited for every leaf (AccumulateGrad) stream ("final_callbacks may use any grad on its
//   device's current stream", autograd/engine.cpp). It adds there, and the optimizer step that
//   follows backward on the caller's thread is queued on those streams after it;
// - Replicate mode sums on ReduceToPrimary, not on LibTorch's ReduceAdd, which adds on whatever
//   streams the engine's worker thread has current. It makes the forward's streams current and
//   wait for the node's canonical stream (which the engine made wait for every input), sums, and
//   makes the stream the engine hands the sum on wait for it (PyTorch's contract for a node
//   that spans devices);
// - a gradient freed after a copy read it is recorded on the copy's stream, so the caching
//   allocator cannot give its memory out before the copy is done;
// - the constructor's copies (the primary to its device, the persistent replicas) are waited
//   for once, so the streams current at construction and at forward need not be the same.
// Work the caller queues on other streams is the caller's to order, as in PyTorch.

// The caller's current stream of each CUDA device in `devices` (Note [DataParallel streams]).
class CallerStreams {
 public:
  explicit CallerStreams(const std::vector<c10::Device>& devices) {
    for (const auto& d : devices) {
      if (d.is_cuda() && !of(d)) streams_.push_back(c10::impl::VirtualGuardImpl(d.type()).getStream(d));
    }
  }
  std::optional<c10::Stream> of(const c10::Device& device) const {
    for (const auto& s : streams_) {
      if (s.device() == device) return s;
    }
    return std::nullopt;
  }
  const std::vector<c10::Stream>& all() const { return streams_; }

 private:
  std::vector<c10::Stream> streams_;
};

// Makes `waiter` wait for the work queued so far on `done` (nothing when they are one stream).
void order_after(const c10::Stream& waiter, const c10::Stream& done) {
  if (waiter == done) return;
  c10::Event event(done.device_type());
  event.record(done);
  waiter.wait(event);
}

// Replicate mode's backward for one parameter: the copies' gradients summed on the primary's
// device, on the forward's streams (Note [DataParallel streams]). LibTorch's torch::nn
// ReduceAdd computes the same sum without minding streams.
class ReduceToPrimary final : public torch::autograd::Node {
 public:
  ReduceToPrimary(c10::Device destination, std::vector<c10::Stream> streams)
      : destination_(destination), streams_(std::move(streams)) {}
  std::string name() const override { return "tandem::dp::ReduceToPrimary"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TANDEM_CHECK(!torch::autograd::compute_requires_grad(grads),
                 "DataParallel: backward with create_graph is not supported (replica gradients are summed outside autograd)");
    // The engine made the canonical stream current on its device and had it wait for every input.
    const std::optional<c10::Stream> canonical = stream();
    // Without a canonical stream (every input on the cpu), the engine takes the sum as made on
    // this thread's current stream of its device, as it is now.
    std::optional<c10::Stream> hand_over = canonical;
    if (!hand_over && destination_.is_cuda()) hand_over = c10::impl::VirtualGuardImpl(destination_.type()).getStream(destination_);

    at::Tensor sum;
    {
      c10::MultiStreamGuard forward_streams(streams_);
      if (canonical) {
        for (const auto& s : streams_) order_after(s, *canonical);
      }
      for (auto& g : grads) {
        if (!g.defined()) continue;
        at::Tensor here = g.to(destination_);
        if (!here.is_same(g)) tandem::detail::record_on_current_stream(g);  // the copy read it on this stream
        if (sum.defined()) {
          sum.add_(here);
        } else {
          sum = here.is_same(g) ? g.clone() : here;
        }
      }
      if (sum.defined() && sum.is_cuda() && hand_over) {
        order_after(*hand_over, c10::impl::VirtualGuardImpl(sum.device().type()).getStream(sum.device()));
      }
    }
    return {sum};
  }

 private:
  c10::Device destination_;
  std::vector<c10::Stream> streams_;
};

// Replicate mode: every copy's parameter (and buffer that requires grad) gets its gradient edge
// to a ReduceToPrimary node whose next edge is the primary's tensor — what
// torch::nn::replicate_grad_edges does with LibTorch's ReduceAdd.
void connect_to_primary(torch::nn::Module& primary, const std::vector<std::shared_ptr<torch::nn::Module>>& copies,
                        const std::vector<c10::Stream>& streams) {
  auto connect = [&](const std::vector<at::Tensor>& originals, const std::vector<std::vector<at::Tensor>>& replicas) {
    for (size_t i = 0; i < originals.size(); ++i) {
      if (!originals[i].requires_grad()) continue;
      auto node = std::make_shared<ReduceToPrimary>(originals[i].device(), streams);
      node->set_next_edges(torch::autograd::collect_next_edges(originals[i]));
      for (const auto& r : replicas) torch::autograd::set_history(r[i], node);
    }
  };
  std::vector<std::vector<at::Tensor>> parameters, buffers;
  for (const auto& c : copies) {
    parameters.push_back(c->parameters());
    buffers.push_back(c->buffers());
  }
  connect(primary.parameters(), parameters);
  connect(primary.buffers(), buffers);
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
  tune_host_allocator();  // Note [Host allocator]

  const auto& devices = *options_.devices();
  primary_->to(devices.front());
  if (options_.track_cpu_memory()) memory_ = std::make_unique<CpuMemoryTracker>(devices.size());
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
  // Once: the copies above are done before any stream uses them (Note [DataParallel streams]).
  const CallerStreams streams(devices);
  for (const auto& s : streams.all()) s.synchronize();
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
  } else {
    try {
      replica = primary_->clone(device);
    } catch (const c10::Error& e) {
      throw Error("DataParallel: cannot copy " + primary_->name() + " to " + device.str() +
                  ": derive it from torch::nn::Cloneable<" + primary_->name() +
                  "> (and implement reset()), or pass a make_replica function");
    }
  }
  return replica;
}

void DpCore::sync_persistent_replicas() {
  // Every forward copies the primary's parameters and buffers out (Note [DataParallel buffers]).
  // A version-counter shortcut would skip unchanged parameters, but LibTorch's optimizers update
  // parameters without moving it, so the copy is unconditional: one memcpy of the model per
  // replica, where Replicate mode also rebuilds the module and its autograd edges.
  at::NoGradGuard no_grad;
  for (size_t k = 1; k < replicas_.size(); ++k) {
    copy_state(*primary_, *replicas_[k], /*parameters=*/true);
    match_requires_grad(*primary_, *replicas_[k]);  // their gradient hooks stay (the constructor's)
  }
}

void DpCore::arm_gradient_reduction() {
  if (!reduction_armed_ || reduction_queued_.exchange(true)) return;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { reduce_gradients(); });
}

// Runs as the engine's final callback, on the backward caller's current streams, which the
// engine made wait for every leaf's stream (Note [DataParallel streams]).
void DpCore::reduce_gradients() {
  at::NoGradGuard no_grad;
  auto primary_params = primary_->parameters();
  for (size_t k = 1; k < replicas_.size(); ++k) {
    auto params = replicas_[k]->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& g = params[i].mutable_grad();
      if (!g.defined()) continue;
      if (!primary_params[i].requires_grad()) {  // frozen after the replicas were made
        g.reset();
        continue;
      }
      at::Tensor& total = primary_params[i].mutable_grad();
      at::Tensor here = g.to(primary_params[i].device());
      if (!here.is_same(g)) tandem::detail::record_on_current_stream(g);  // the copy read it on this stream; g is freed below
      if (total.defined()) {
        total.add_(here);
      } else {
        total = here.is_same(g) ? g.clone() : here;
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

  // Every copy below, the replicas and the gather use these streams (Note [DataParallel streams]).
  std::vector<c10::Device> used_devices(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(used));
  used_devices.push_back(*options_.output_device());
  const CallerStreams streams(used_devices);

  std::vector<std::shared_ptr<torch::nn::Module>> replicas{primary_};
  if (options_.mode() == Mode::Replicate) {
    std::vector<std::shared_ptr<torch::nn::Module>> copies;
    for (size_t k = 1; k < used; ++k) {
      copies.push_back(make_replica(devices[k]));  // counted as parameter bytes, not activations
      match_requires_grad(*primary_, *copies.back());
    }
    // Autograd edges from every copy's parameters back to the primary's.
    if (!copies.empty()) connect_to_primary(*primary_, copies, streams.all());
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
  // The chunks' copies, on this thread too, each charged to its replica.
  std::vector<at::Tensor> replica_inputs(used);
  for (size_t k = 0; k < used; ++k) {
    std::optional<CpuMemoryTracker::Scope> attribute;
    if (memory_) attribute.emplace(*memory_, k);
    try {
      replica_inputs[k] = chunks[k].to(devices[k]);
    } catch (const std::exception& e) {
      throw Error("DataParallel: replica " + std::to_string(k) + " on " + devices[k].str() +
                  " failed: cannot copy its chunk of the input there: " + one_line(e));
    }
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
      // The replica's device current, and on it the caller's current stream.
      c10::OptionalDeviceGuard device_guard(devices[k].is_cuda() ? std::optional<c10::Device>(devices[k]) : std::nullopt);
      c10::OptionalStreamGuard stream_guard(streams.of(devices[k]));
      std::optional<CpuMemoryTracker::Scope> attribute;
      if (memory_) attribute.emplace(*memory_, k);
      if (devices[k].is_cpu()) set_intra_op_threads(share);
      outputs[k] = forward_(*replicas[k], replica_inputs[k]);
    } catch (const std::exception& e) {
      errors[k] = one_line(e);
    } catch (...) {
      errors[k] = "unknown exception";
    }
  };
  run_replicas(used, run);
  set_intra_op_threads(total_threads);
  replica_inputs.clear();
  for (size_t k = 0; k < used; ++k) {
    if (!errors[k].empty()) {
      throw Error("DataParallel: replica " + std::to_string(k) + " on " + devices[k].str() + " failed: " + errors[k]);
    }
  }
  std::optional<CpuMemoryTracker::Scope> attribute;
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
      // The peak of the whole device, which already holds the parameters and gradients above.
      m.device_peak_bytes = cuda_peak_allocated_bytes(devices[k].index());
      m.derive_activations();
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
