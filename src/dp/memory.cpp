#include "tandem/dp/memory.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include <c10/core/CPUAllocator.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace tandem::dp {

struct MemoryTracker::Counters {
  std::mutex mutex;
  std::vector<int64_t> live, peak;
  void add(size_t slot, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    if (slot >= live.size()) return;
    live[slot] += bytes;
    peak[slot] = std::max(peak[slot], live[slot]);
  }
};

namespace {

// The thread's current attribution: which tracker's counters, and which replica.
thread_local const std::shared_ptr<MemoryTracker::Counters>* t_counters = nullptr;
thread_local size_t t_slot = 0;

// Wraps LibTorch's CPU allocator once per process. Outside a Scope an allocation is passed
// through untouched. A tracked allocation keeps context == data (oneDNN and others allocate
// "raw" through raw_allocate / raw_deleter, which require it) and is found again by address.
class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* inner) { inner_ = inner; }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    if (!t_counters || n == 0) return inner;
    void* data = inner.get();
    const c10::Device device = inner.device();
    c10::DeleterFnPtr deleter = inner.get_deleter();
    void* context = inner.release_context();
    Record record{context, deleter, static_cast<int64_t>(n), t_slot, *t_counters};
    record.counters->add(record.slot, record.bytes);
    {
      std::lock_guard<std::mutex> lock(mutex());
      records()[data] = std::move(record);
    }
    return c10::DataPtr(data, data, &Release, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  struct Record {
    void* context = nullptr;
    c10::DeleterFnPtr deleter = nullptr;
    int64_t bytes = 0;
    size_t slot = 0;
    std::shared_ptr<MemoryTracker::Counters> counters;  // outlives the tracker if it must
  };
  static void Release(void* data) {
    Record record;
    bool tracked = false;
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto it = records().find(data);
      if (it != records().end()) {
        record = std::move(it->second);
        records().erase(it);
        tracked = true;
      }
    }
    if (!tracked) {  // a raw allocation made outside any Scope
      inner_->raw_deleter()(data);
      return;
    }
    record.counters->add(record.slot, -record.bytes);
    if (record.deleter) record.deleter(record.context);
  }
  static std::unordered_map<void*, Record>& records() {
    static auto* map = new std::unordered_map<void*, Record>();  // never destroyed: frees may come late
    return *map;
  }
  static std::mutex& mutex() {
    static auto* m = new std::mutex();
    return *m;
  }
  static inline c10::Allocator* inner_ = nullptr;
};

void install_tracking_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static TrackingAllocator allocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
  });
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

std::string megabytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f MB", bytes / 1e6);
  return text;
}

}  // namespace

MemoryTracker::MemoryTracker(size_t replicas) : counters_(std::make_shared<Counters>()) {
  install_tracking_allocator();
  ensure(replicas);
}

MemoryTracker::~MemoryTracker() = default;

void MemoryTracker::ensure(size_t replicas) {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  if (counters_->live.size() < replicas) {
    counters_->live.resize(replicas, 0);
    counters_->peak.resize(replicas, 0);
  }
}

MemoryTracker::Scope::Scope(MemoryTracker& tracker, size_t replica)
    : previous_(const_cast<std::shared_ptr<Counters>*>(t_counters)), previous_slot_(t_slot) {
  t_counters = &tracker.counters_;
  t_slot = replica;
}

MemoryTracker::Scope::~Scope() {
  t_counters = static_cast<const std::shared_ptr<Counters>*>(previous_);
  t_slot = previous_slot_;
}

int64_t MemoryTracker::peak(size_t replica) const {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  return replica < counters_->peak.size() ? counters_->peak[replica] : 0;
}

int64_t MemoryTracker::live(size_t replica) const {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  return replica < counters_->live.size() ? counters_->live[replica] : 0;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  counters_->peak = counters_->live;
}

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
