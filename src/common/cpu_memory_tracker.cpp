#include "common/cpu_memory_tracker.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/core/CPUAllocator.h>

namespace tandem {

struct CpuMemoryTracker::Counters {
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

// The thread's current attribution: which tracker's counters, and which slot.
thread_local const std::shared_ptr<CpuMemoryTracker::Counters>* t_counters = nullptr;
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
    std::shared_ptr<CpuMemoryTracker::Counters> counters;  // outlives the tracker if it must
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

}  // namespace

CpuMemoryTracker::CpuMemoryTracker(size_t slots) : counters_(std::make_shared<Counters>()) {
  install_tracking_allocator();
  ensure(slots);
}

CpuMemoryTracker::~CpuMemoryTracker() = default;

void CpuMemoryTracker::ensure(size_t slots) {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  if (counters_->live.size() < slots) {
    counters_->live.resize(slots, 0);
    counters_->peak.resize(slots, 0);
  }
}

CpuMemoryTracker::Scope::Scope(CpuMemoryTracker& tracker, size_t slot)
    : previous_(const_cast<std::shared_ptr<Counters>*>(t_counters)), previous_slot_(t_slot) {
  t_counters = &tracker.counters_;
  t_slot = slot;
}

CpuMemoryTracker::Scope::~Scope() {
  t_counters = static_cast<const std::shared_ptr<Counters>*>(previous_);
  t_slot = previous_slot_;
}

int64_t CpuMemoryTracker::peak(size_t slot) const {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  return slot < counters_->peak.size() ? counters_->peak[slot] : 0;
}

int64_t CpuMemoryTracker::live(size_t slot) const {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  return slot < counters_->live.size() ? counters_->live[slot] : 0;
}

void CpuMemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  counters_->peak = counters_->live;
}

}  // namespace tandem
