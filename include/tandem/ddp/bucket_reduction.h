#pragma once
// How the reducer reduces its buckets: the seam between DDP's iteration and what a bucket becomes.
//
// Note [Bucket reduction]
// The reducer (Note [Reducer]) owns the iteration: the hooks, the buckets and their launch order,
// the end of backward, a failed backward, join. A BucketReduction owns what happens to a bucket:
// - its layout: how long its flat buffer is for the gradients it holds (the rest is zero padding),
//   and whether the buffers stay from the first forward on (gradients may then be views of them)
//   or exist only from a bucket's first gradient of a backward until that backward ends;
// - what a ready gradient does to its slot of the buffer (fill);
// - which collective a full bucket starts (launch), and what its result becomes (finish), and
//   what the parameters' gradients are once every bucket of a complete backward was reduced
//   (write_back).
// Two exist. ddp's AllReduceBuckets (src/ddp/all_reduce_buckets.h) is the default: PyTorch DDP's
// pre-divided all-reduce, communication hooks, gradient_as_bucket_view. zero's
// ReduceScatterBuckets (src/zero/reduce_scatter_buckets.h) is ZeRO-2's: each bucket is
// reduce-scattered into this rank's slice and no full gradient is kept (Note [Sharded gradients]).
// The reducer calls every method under its lock; none is for users.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/ddp/comm_hook.h"

namespace tandem::ddp {

struct Bucket;
class Reducer;

class BucketReduction {
 public:
  virtual ~BucketReduction() = default;

  /// Before Reducer::set_bucket_reduction installs it: throws tandem::Error when it cannot work
  /// with `reducer` as it is (its options, its reduction now, a forward already run).
  virtual void check(const Reducer& reducer) const = 0;
  /// Reducer::register_comm_hook (Note [DDP communication hook]): keeps `hook`, or throws
  /// tandem::Error when it reduces through none, has one already, or `reducer` is configured.
  virtual void register_comm_hook(const Reducer& reducer, CommHook hook) = 0;
  virtual bool has_comm_hook() const = 0;
  /// join() (Note [Join]): throws tandem::Error when a joined rank cannot mirror this reduction.
  virtual void check_join() const = 0;
  /// Whether a world of one has nothing to exchange: no buffer, no copy (Note [World of one]).
  virtual bool passes_through_alone() const = 0;

  /// The length of a bucket's flat buffer for `numel` elements of gradients (at least `numel`).
  virtual int64_t buffer_numel(int64_t numel) const = 0;
  /// Whether the buffers live from the first forward on; if not, from a bucket's first gradient of
  /// a backward until the end of that backward.
  virtual bool keeps_buffers() const = 0;

  /// Parameter `index`'s gradient `grad` is ready (`produced`: autograd made it in this backward;
  /// else it is undefined or an earlier one): puts its share into `view`, its slot of the buffer.
  virtual void fill(size_t index, at::Tensor& grad, at::Tensor& view, bool produced) = 0;
  /// Starts bucket `index`'s reduction (its buffer is allocated; `last`: the last bucket).
  virtual std::unique_ptr<PendingReduction> launch(size_t index, Bucket& bucket, bool last) = 0;
  /// What a launched bucket's wait() returned, after a complete backward.
  virtual void finish(Bucket& bucket, const at::Tensor& result) = 0;
  /// After every bucket of a complete backward was finished: the parameters' gradients.
  /// `used_globally[i]`: some rank produced parameter i's gradient.
  virtual void write_back(const std::vector<Bucket>& buckets, std::vector<at::Tensor>& parameters,
                          const std::vector<bool>& used_globally) = 0;
  /// The iteration ended, however it ended.
  virtual void reset() = 0;
};

}  // namespace tandem::ddp
