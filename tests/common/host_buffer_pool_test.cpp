// The host buffer pool (Note [Host buffer pool] in src/common/host_buffer_pool.cpp): a freed
// buffer serves the next request of its size (or up to a quarter smaller), free bytes never exceed
// the limit, and a collective's scratch comes from the pool when the tensor it serves does.
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

TEST(HostBufferPool, FreeBytesStayUnderTheLimitTheOldestGoFirst) {
  HostBufferPool pool;
  pool.keep_at_most(3 * kMiB);
  void* older = nullptr;
  void* newer = nullptr;
  {
    c10::DataPtr a = pool.allocate(2 * kMiB), b = pool.allocate(2 * kMiB);
    older = b.get();  // b is freed first (destroyed in reverse order)
    newer = a.get();
  }
  EXPECT_EQ(pool.stats().cached, 2 * kMiB) << "both would pass the 3 MiB limit: the older was unmapped";
  pool.keep_at_most(kMiB);  // never lowered
  {
    c10::DataPtr c = pool.allocate(kMiB / 2);
  }
  EXPECT_EQ(pool.stats().cached, 2 * kMiB + kMiB / 2);
  c10::DataPtr again = pool.allocate(2 * kMiB);
  EXPECT_EQ(again.get(), newer);
  EXPECT_NE(again.get(), older);
  // A size nobody asks for any more gives way: two 1.5 MiB buffers freed push the others out.
  {
    c10::DataPtr d = pool.allocate(3 * kMiB / 2), e = pool.allocate(3 * kMiB / 2);
  }
  EXPECT_EQ(pool.stats().cached, 3 * kMiB);
  c10::DataPtr half = pool.allocate(kMiB / 2);
  EXPECT_EQ(pool.stats().reused, 1) << "the 0.5 MiB buffer was unmapped to make room";
  // A buffer larger than the limit is never kept.
  { c10::DataPtr huge = pool.allocate(4 * kMiB); }
  EXPECT_EQ(pool.stats().cached, 3 * kMiB);
}

TEST(HostBufferPool, ZeroBytesIsNoBuffer) {
  HostBufferPool pool;
  c10::DataPtr none = pool.allocate(0);
  EXPECT_EQ(none.get(), nullptr);
  EXPECT_EQ(pool.stats().mapped, 0);
}

TEST(HostBufferPool, ScratchComesFromThePoolWhenWhatItServesDoes) {
  HostBufferPool& process = HostBufferPool::instance();
  at::Tensor pooled = at::detail::empty_generic({100}, &process, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                at::kFloat, std::nullopt);
  at::Tensor scratch = tandem::detail::scratch_like(pooled, 300);
  EXPECT_EQ(scratch.storage().allocator(), &process);
  EXPECT_EQ(scratch.numel(), 300);
  EXPECT_EQ(scratch.scalar_type(), at::kFloat);
  // Any other allocator is not followed (it may be pinned, or scoped like this one).
  HostBufferPool scoped;
  at::Tensor other = at::detail::empty_generic({4}, &scoped, c10::DispatchKeySet(c10::DispatchKey::CPU), at::kDouble,
                                               std::nullopt);
  at::Tensor other_scratch = tandem::detail::scratch_like(other, 8);
  EXPECT_EQ(other_scratch.storage().allocator(), at::ones({1}).storage().allocator());
  EXPECT_EQ(other_scratch.scalar_type(), at::kDouble);
}

}  // namespace
