#include "common/host_buffer_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <ATen/EmptyTensor.h>

#include "tandem/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define TANDEM_POOL_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TANDEM_POOL_UNDER_ASAN 1
#endif
#endif

namespace tandem::detail {

// Note [Host buffer pool]
// FSDP needs, every step, a unit's gathered parameters, its all-gather's send and receive buffers,
// its packed gradients and the reduce-scatter's receive buffer: megabytes each, freed a moment
// later, partly on Gloo's threads, the same sizes every step. Under glibc they either stay in the
// process's heaps, where mixed sizes and threads fragmented them (a budget-test rank grew by a
// quarter of a gigabyte per step), or, mapped afresh and unmapped every time (the mmap threshold
// of Note [Host allocator]), every page of them faults again each step: about 41,000 faults per
// step on the bench's large model at 2 ranks, 17,000 once this pool served them. This pool maps
// such buffers itself and keeps them when freed, up to a limit the FSDP engines set (a few times their largest unit,
// plus their gradient rows): a step reuses the last step's buffers (a free buffer up to a quarter
// larger serves), faults nothing in steady state, and never holds more free bytes than the limit;
// when a freed buffer would pass it, the buffers freed longest ago are unmapped first, so sizes
// no one asks for any more (another model's) give way. Buffers under 64 KiB are not pooled: they
// stay in the heap anyway, and a mapping each would cost more than it saves. Everything else
// (activations, autograd's gradients) stays with the host allocator's policy.
// Under AddressSanitizer the pool hands out the default CPU allocator's memory, which ASan sees.

struct HostBufferPool::Block {
  HostBufferPool* pool;
  void* data;
  size_t bytes;  // mapped
};

namespace {
size_t whole_pages(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

at::Tensor from_pool(int64_t numel, at::ScalarType dtype) {
  return at::detail::empty_generic({numel}, &HostBufferPool::instance(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   dtype, std::nullopt);
}
}  // namespace

HostBufferPool& HostBufferPool::instance() {
  static HostBufferPool* pool = new HostBufferPool();
  return *pool;
}

c10::DataPtr HostBufferPool::allocate(size_t bytes) {
  if (bytes == 0) return {nullptr, nullptr, nullptr, c10::Device(c10::kCPU)};
  TANDEM_CHECK(bytes <= (SIZE_MAX >> 2), "host buffer pool: ", bytes, " bytes is more than it can map");
  const size_t mapped = whole_pages(bytes);
  auto block = std::make_unique<Block>(Block{this, nullptr, mapped});
  {
    std::lock_guard<std::mutex> hold(mutex_);
    auto it = free_.lower_bound(mapped);
    if (it != free_.end() && it->first <= mapped + mapped / 4) {
      block->bytes = it->first;
      block->data = it->second->second;
      free_order_.erase(it->second);
      free_.erase(it);
      stats_.cached -= block->bytes;
      stats_.live += block->bytes;
      ++stats_.reused;
    }
  }
  if (!block->data) {
    void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
      const int error = errno;
      throw Error("host buffer pool: mapping " + std::to_string(mapped) + " bytes failed: " + std::strerror(error));
    }
    block->data = data;
    std::lock_guard<std::mutex> hold(mutex_);
    stats_.live += mapped;
    ++stats_.mapped;
  }
  void* data = block->data;
  return {data, block.release(), &HostBufferPool::release, c10::Device(c10::kCPU)};
}

void HostBufferPool::release(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  block->pool->give_back(block);
}

void HostBufferPool::give_back(Block* block) {
  const Block b = *block;
  delete block;
  std::vector<std::pair<size_t, void*>> unmap;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    stats_.live -= b.bytes;
    if (b.bytes > limit_) {
      unmap.emplace_back(b.bytes, b.data);
    } else {
      free_order_.emplace_front(b.bytes, b.data);
      free_.emplace(b.bytes, free_order_.begin());
      stats_.cached += b.bytes;
      while (stats_.cached > limit_) {  // the oldest free buffers make room
        const auto oldest = std::prev(free_order_.end());
        auto range = free_.equal_range(oldest->first);
        for (auto it = range.first; it != range.second; ++it) {
          if (it->second == oldest) {
            free_.erase(it);
            break;
          }
        }
        stats_.cached -= oldest->first;
        unmap.push_back(*oldest);
        free_order_.erase(oldest);
      }
    }
  }
  for (const auto& [bytes, data] : unmap) munmap(data, bytes);
}

void HostBufferPool::keep_at_most(size_t bytes) {
  std::lock_guard<std::mutex> hold(mutex_);
  if (bytes > limit_) limit_ = bytes;
}

HostBufferPool::Stats HostBufferPool::stats() const {
  std::lock_guard<std::mutex> hold(mutex_);
  return stats_;
}

size_t pooled_bytes(size_t bytes) { return bytes < kPooledMinBytes ? 0 : whole_pages(bytes); }

at::Tensor pooled_empty(int64_t numel, const at::TensorOptions& options) {
#if defined(TANDEM_POOL_UNDER_ASAN)
  return at::empty({numel}, options);
#else
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(options.dtype().toScalarType());
  if (options.device().type() != c10::kCPU || bytes < kPooledMinBytes) return at::empty({numel}, options);
  return from_pool(numel, options.dtype().toScalarType());
#endif
}

at::Tensor scratch_like(const at::Tensor& like, int64_t numel) {
  // Only the pool is followed: another allocator may be pinned memory, or scoped (a test's), and
  // Gloo can release the scratch after it is gone.
  if (!like.is_cpu() || !like.has_storage() || like.storage().allocator() != &HostBufferPool::instance()) {
    return at::empty({numel}, like.options());
  }
  return from_pool(numel, like.scalar_type());
}

}  // namespace tandem::detail
