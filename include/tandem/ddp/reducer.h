#pragma once
// Reducer: averages gradients across ranks while backward runs.
//
// Note [Reducer]
// - A post hook on each parameter's AccumulateGrad node fires once its gradient for this backward
//   is complete. The hook copies the gradient, multiplied by 1/world_size, into the parameter's
//   slot of a flat bucket (or, with gradient_as_bucket_view, finds it already there and scales it
//   in place). Multiplying by the reciprocal is PyTorch's rounding: exact for power-of-two worlds,
//   within one ulp of a division otherwise.
// - When a bucket's last slot is filled, its asynchronous all-reduce starts, while backward goes
//   on. Buckets start strictly in index order on every rank, so collectives match across ranks
//   even when hooks fire in different orders.
// - A callback queued with the autograd engine runs when backward ends: it waits for every bucket
//   and leaves the average in each param.grad (a copy, or the bucket view itself).
// - After the first synced iteration the buckets are rebuilt in the order gradients actually
//   arrived (rank 0's order, broadcast), unless unused parameters are searched every iteration.
// - A backward that leaves buckets incomplete (a parameter without gradient and no
//   find_unused_parameters) is an error naming the parameters, raised from backward() itself.
// - The destructor removes the hooks.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"
#include "tandem/ddp/bucket_assignment.h"
#include "tandem/ddp/comm_hook.h"
#include "tandem/ddp/options.h"

namespace torch::autograd {
struct Node;
}

namespace tandem::ddp {

struct Bucket {
  std::vector<size_t> parameters;   // indices into the reducer's parameter list
  at::Tensor contents;              // flat buffer
  std::vector<at::Tensor> views;    // one per parameter, shaped like it
  int64_t size_limit = 0;
  size_t pending = 0;               // slots not yet filled in this backward
  std::unique_ptr<PendingReduction> reduction;
};

class Reducer {
 public:
  Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
          std::shared_ptr<comm::ProcessGroup> pg, DistributedDataParallelOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Before a synced forward: fails if the last one's reduction never finished; rebuilds buckets.
  void prepare_for_forward();
  /// After a synced forward: arms the hooks; finds unused parameters from `outputs` when asked.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);

  void register_comm_hook(CommHook hook);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  /// Parameter indices found unused in the last synced forward.
  const std::vector<size_t>& unused_parameters() const { return unused_; }
  /// How many times the buckets were (re)built: 1 at construction, 2 after the rebuild.
  int bucket_builds() const { return bucket_builds_; }

 private:
  void build_buckets(const BucketAssignment& assignment);
  void autograd_hook(size_t index);
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void finalize_backward();
  void reset_iteration();
  std::string describe_missing() const;

  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::shared_ptr<comm::ProcessGroup> pg_;
  DistributedDataParallelOptions options_;
  CommHook comm_hook_;

  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> locator_;  // parameter -> (bucket, slot)
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators_;
  std::vector<uintptr_t> hook_keys_;

  std::mutex mutex_;
  bool expect_hooks_ = false;        // armed by a synced forward
  bool finalize_queued_ = false;
  bool awaiting_backward_ = false;   // a synced forward happened and its backward has not ended
  size_t next_bucket_ = 0;
  std::vector<bool> ready_;
  std::vector<uint8_t> used_locally_;
  std::vector<size_t> unused_;
  bool unused_known_ = false;        // static_graph: found once
  std::vector<bool> static_used_globally_;

  // Rebuilding from the arrival order of the first synced backward.
  std::vector<int64_t> arrival_order_;
  bool rebuild_pending_ = false;
  int bucket_builds_ = 0;
  int64_t iteration_ = 0;
};

}  // namespace tandem::ddp
