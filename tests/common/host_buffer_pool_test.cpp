// The host buffer pool (Note [Host buffer pool] in src/common/host_buffer_pool.cpp): a freed
// buffer serves the next request of its size (or up to a quarter smaller), free bytes never exceed
// the limit, and a collective's scratch comes from the allocator of the tensor it serves.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>

#include "common/host_buffer_pool.h"

namespace {

using tandem::detail::HostBufferPool;
constexpr size_t kMiB = size_t{1} << 20;

TEST(HostBufferPool, AFreedBufferServesTheNextRequestOfItsSize) {
  HostBufferPool pool;
  pool.keep_at_most(8 * kMiB);
  void* first = nullptr;
  {
    c10::DataPtr buffer = pool.allocate(kMiB);
    first = buffer.get();
    static_cast<char*>(first)[kMiB - 1] = 7;  // writable to its last byte
    EXPECT_EQ(pool.stats().live, kMiB);
  }
  EXPECT_EQ(pool.stats().live, 0u);
  EXPECT_EQ(pool.stats().cached, kMiB);
  c10::DataPtr again = pool.allocate(kMiB);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool.stats().mapped, 1);
  EXPECT_EQ(pool.stats().reused, 1);
  EXPECT_EQ(pool.stats().cached, 0u);
}

TEST(HostBufferPool, AFreeBufferUpToAQuarterLargerServesNoLarger) {
  HostBufferPool pool;
  pool.keep_at_most(16 * kMiB);
  void* five_quarters = pool.allocate(5 * kMiB / 4).get();  // freed at once: the DataPtr is a temporary
  void* double_size = pool.allocate(2 * kMiB).get();
  EXPECT_EQ(pool.stats().cached, 5 * kMiB / 4 + 2 * kMiB);
  c10::DataPtr one = pool.allocate(kMiB);
  EXPECT_EQ(one.get(), five_quarters);
  c10::DataPtr another = pool.allocate(kMiB);
  EXPECT_NE(another.get(), double_size) << "twice the size is not served";
  EXPECT_EQ(pool.stats().mapped, 3);
}

TEST(HostBufferPool, FreeBytesBeyondTheLimitAreUnmapped) {
  HostBufferPool pool;
  pool.keep_at_most(3 * kMiB);
  {
    c10::DataPtr a = pool.allocate(2 * kMiB), b = pool.allocate(2 * kMiB);
  }
  EXPECT_EQ(pool.stats().cached, 2 * kMiB) << "the second 2 MiB would pass the 3 MiB limit";
  pool.keep_at_most(kMiB);  // never lowered
  {
    c10::DataPtr c = pool.allocate(kMiB / 2);
  }
  EXPECT_EQ(pool.stats().cached, 2 * kMiB + kMiB / 2);
}

TEST(HostBufferPool, ZeroBytesIsNoBuffer) {
  HostBufferPool pool;
  c10::DataPtr none = pool.allocate(0);
  EXPECT_EQ(none.get(), nullptr);
  EXPECT_EQ(pool.stats().mapped, 0);
}

TEST(HostBufferPool, ScratchComesFromTheAllocatorOfWhatItServes) {
  HostBufferPool pool;
  pool.keep_at_most(kMiB);
  at::Tensor pooled = at::detail::empty_generic({100}, &pool, c10::DispatchKeySet(c10::DispatchKey::CPU), at::kFloat,
                                                std::nullopt);
  at::Tensor scratch = tandem::detail::scratch_like(pooled, 300);
  EXPECT_EQ(scratch.storage().allocator(), &pool);
  EXPECT_EQ(scratch.numel(), 300);
  EXPECT_EQ(scratch.scalar_type(), at::kFloat);
  at::Tensor plain = at::ones({4}, at::kDouble);
  at::Tensor plain_scratch = tandem::detail::scratch_like(plain, 8);
  EXPECT_EQ(plain_scratch.storage().allocator(), plain.storage().allocator());
  EXPECT_EQ(plain_scratch.scalar_type(), at::kDouble);
}

}  // namespace
