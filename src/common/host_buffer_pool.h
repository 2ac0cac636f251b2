#pragma once
// Internal: a pool of large host buffers that are freed and needed again every step (FSDP's
// gathered units, its all-gather and reduce-scatter buffers). Note [Host buffer pool] in the .cpp.
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>

namespace tandem::detail {

class HostBufferPool final : public c10::Allocator {
 public:
  /// The process's pool (never destroyed: buffers can be released by Gloo's threads at exit).
  static HostBufferPool& instance();
  /// A pool of its own (tests): it must outlive every buffer it hands out.
  HostBufferPool() = default;
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  /// Raises the most free bytes the pool keeps for reuse. A freed buffer that would pass it makes
  /// room by unmapping the buffers freed longest ago (a size no one asks for any more goes first).
  void keep_at_most(size_t bytes);

  struct Stats {
    size_t live = 0, cached = 0;    // bytes in buffers in use, and free for reuse
    int64_t mapped = 0, reused = 0; // buffers mapped afresh, and served from the pool, so far
  };
  Stats stats() const;

 private:
  struct Block;
  static void release(void* block);
  void give_back(Block* block);

  mutable std::mutex mutex_;
  std::list<std::pair<size_t, void*>> free_order_;  // free buffers (mapped size, address), newest first
  std::multimap<size_t, std::list<std::pair<size_t, void*>>::iterator> free_;  // by size
  size_t limit_ = 0;
  Stats stats_;
};

/// Buffers smaller than this come from the host allocator: they stay in its heap anyway (Note [Host
/// allocator]), and a mapping each would cost more than it saves.
constexpr size_t kPooledMinBytes = size_t{64} << 10;

/// The bytes a buffer of `bytes` takes in the pool (whole pages); 0 when it would not be pooled.
size_t pooled_bytes(size_t bytes);

/// An uninitialized CPU tensor of `numel` elements from the pool when it is at least
/// kPooledMinBytes (the default CPU allocator when built with AddressSanitizer, which then sees
/// every access); `at::empty` otherwise and on other devices.
at::Tensor pooled_empty(int64_t numel, const at::TensorOptions& options);

/// An uninitialized flat tensor of `numel` elements of `like`'s dtype: from the process's pool when
/// `like`'s storage comes from it (a collective's scratch comes from where the buffers it serves
/// come from), else `at::empty`.
at::Tensor scratch_like(const at::Tensor& like, int64_t numel);

}  // namespace tandem::detail
