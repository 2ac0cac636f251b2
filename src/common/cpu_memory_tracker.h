#pragma once
// Counting CPU allocations by thread: while a Scope is alive on a thread, every allocation that
// thread makes through LibTorch's CPU allocator counts for the Scope's slot of a tracker, until
// it is freed (by any thread). A tracking allocator wraps LibTorch's once per process, at the
// first tracker; outside every Scope it passes allocations through untouched.
//
// Users: DataParallel charges each replica's forward to the replica whose thread ran it (Note
// [DataParallel memory accounting] in tandem/dp/memory.h, one slot per replica); a pipeline
// schedule with track_memory counts a step's bytes above its start (Note [Step measurements] in
// src/pp/schedule.cpp, one slot); tests count what an operation keeps alive.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace tandem {

class CpuMemoryTracker {
 public:
  explicit CpuMemoryTracker(size_t slots);
  ~CpuMemoryTracker();
  /// While alive, allocations made by this thread count for `slot`.
  class Scope {
   public:
    Scope(CpuMemoryTracker& tracker, size_t slot);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    void* previous_;
    size_t previous_slot_;
  };
  /// The most bytes of `slot` alive at once since the tracker began or reset_peaks().
  int64_t peak(size_t slot) const;
  /// Bytes allocated under this tracker's scopes for `slot` and not yet freed.
  int64_t live(size_t slot) const;
  /// Every slot's peak down to its live bytes.
  void reset_peaks();
  /// At least `slots` slots (new ones at 0).
  void ensure(size_t slots);

  struct Counters;  // internal

 private:
  std::shared_ptr<Counters> counters_;
};

}  // namespace tandem
