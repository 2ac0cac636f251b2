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
//   and leaves the average in each param.grad (a copy, or the bucket view itself). Whatever it
//   meets (a failed collective, a missing gradient), the next iteration starts clean.
// - After the first synced iteration the buckets are rebuilt in the order gradients actually
//   arrived (rank 0's order, broadcast), unless unused parameters are searched every iteration.
// - A backward that leaves buckets incomplete (a parameter without gradient and no
//   find_unused_parameters) is an error naming the parameters, raised from backward() itself.
// - "Used" means autograd produced the parameter's gradient in this backward (the hook fired),
//   never that .grad happens to be defined. A parameter unused on every rank keeps its .grad
//   exactly as it was, bucket views included.
// - A world of one without a communication hook has nothing to exchange: the gradients already
//   are the average, so no bucket is allocated and no gradient is copied (Note [World of one]).
// - What a bucket's buffer holds, which collective reduces it and what the gradients become is a
//   BucketReduction's (Note [Bucket reduction] in bucket_reduction.h): PyTorch DDP's all-reduce
//   by default, ZeRO-2's reduce-scatter through set_bucket_reduction.
// - The destructor removes the hooks.
//
// Note [Failed backward]
// When backward raises (a module's backward, a communication hook, a failed collective), the
// autograd engine drops its queued callbacks: the end-of-backward callback never runs. The
// reducer notices (the callback's token is destroyed unrun) and finishes the iteration before
// the next forward: the ranks agree through the store on how many buckets each launched, each
// launches the missing ones so that every started collective has its partners, waits for all of
// them, and resets. When every rank raised at the same point, training goes on at the next step
// (PyTorch's DDP refuses the next forward instead). When a rank raised alone, the others never
// report, and the next forward fails after the collective timeout naming the ranks that did
// not, while those ranks' own backward fails on the bucket they wait for: the job ends, no hang.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"
#include "tandem/ddp/bucket_assignment.h"
#include "tandem/ddp/bucket_reduction.h"
#include "tandem/ddp/comm_hook.h"
#include "tandem/ddp/options.h"

namespace torch::autograd {
struct Node;
}

namespace tandem::ddp {

struct Bucket {
  std::vector<size_t> parameters;   // indices into the reducer's parameter list
  at::Tensor contents;              // flat buffer (undefined at a world of one without hook)
  int64_t numel = 0;                // of its parameters
  int64_t padded = 0;               // the buffer's length: numel and the reduction's padding
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

  /// Before every forward with gradients enabled: finishes an iteration whose backward failed
  /// (Note [Failed backward]), and fails when the last synced forward's backward never started.
  /// A synced forward also rebuilds the buckets once, after the first iteration.
  void prepare_for_forward(bool synced);
  /// After a synced forward: arms the hooks; finds unused parameters from `outputs` when asked.
  /// `outputs_complete` is false when DDP could not see every tensor of the output.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs, bool outputs_complete,
                            const std::string& output_type);

  void register_comm_hook(CommHook hook);

  /// Note [Bucket reduction]: `reduction` reduces the buckets from the next backward on, which are
  /// `assignment`'s (each bucket's parameter indices, every parameter once, one dtype and device per
  /// bucket, in launch order) and are never rebuilt. Before the first forward; throws
  /// tandem::Error for an assignment that is none of these, or what `reduction` refuses.
  void set_bucket_reduction(std::unique_ptr<BucketReduction> reduction, const BucketAssignment& assignment);
  const BucketReduction& bucket_reduction() const { return *reduction_; }
  const DistributedDataParallelOptions& options() const { return options_; }
  /// Whether the first forward configured the reducer (the buckets' memory, the hook's use).
  bool configured() const { return configured_; }

  /// Note [Join]: this rank has no data left; issue this iteration's collectives with a zero
  /// contribution so that the ranks still training complete theirs. Leaves .grad alone except
  /// where gradients are bucket views.
  void shadow_iteration();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const std::vector<std::string>& names() const { return names_; }
  /// Parameter indices found unused in the last synced forward.
  const std::vector<size_t>& unused_parameters() const { return unused_; }
  /// How many times the buckets were (re)built: 1 at construction, 2 after the rebuild.
  int bucket_builds() const { return bucket_builds_; }
  /// Iterations whose backward failed and that were finished before the next forward.
  int failed_iterations() const { return failed_iterations_; }

  // Called from the autograd engine (hooks and callbacks); not for users.
  void on_backward_started();
  void on_gradient_ready(size_t index);
  void on_backward_finished();
  void on_backward_abandoned();

 private:
  struct Anchor;  // lets autograd nodes that outlive the reducer find out that it is gone

  void build_buckets(const BucketAssignment& assignment);
  void allocate_buckets();
  void allocate_contents(Bucket& bucket);
  void start_backward_locked();
  void mark_ready(size_t index, bool produced);
  void launch_ready_buckets();
  void launch(size_t bucket);
  std::string wait_launched(size_t count);
  size_t agree_on_launched(size_t launched);
  void finish_failed_iteration();
  void finalize_backward();
  std::vector<bool> global_use();
  void end_iteration_bookkeeping();
  void reset_iteration();
  std::string describe_missing() const;

  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::shared_ptr<comm::ProcessGroup> pg_;
  DistributedDataParallelOptions options_;
  std::unique_ptr<BucketReduction> reduction_;  // Note [Bucket reduction]
  std::shared_ptr<Anchor> anchor_;
  int64_t instance_ = 0;             // this reducer's number on its group, the same on every rank

  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> locator_;  // parameter -> (bucket, slot)
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators_;
  std::vector<uintptr_t> hook_keys_;
  bool passthrough_ = false;         // world of one, no hook: nothing to copy or exchange
  bool configured_ = false;          // decided at the first forward (hooks are registered before it)
  bool assignment_given_ = false;    // set_bucket_reduction's buckets: never rebuilt

  std::mutex mutex_;
  bool expect_hooks_ = false;        // armed by a synced forward
  bool backward_started_ = false;    // its end-of-backward callback is queued
  std::atomic<bool> backward_failed_{false};  // ... and was dropped by the engine unrun
  bool awaiting_backward_ = false;   // a synced forward happened and its backward has not ended
  size_t next_bucket_ = 0;
  std::vector<bool> ready_;
  std::vector<int32_t> used_locally_;  // 1 where autograd produced the gradient in this backward
  std::vector<size_t> unused_;
  bool unused_known_ = false;        // static_graph: found once
  std::vector<bool> static_used_globally_;

  // Rebuilding from the arrival order of the first synced backward.
  std::vector<int64_t> arrival_order_;
  bool rebuild_pending_ = false;
  int bucket_builds_ = 0;
  int64_t iteration_ = 0;
  int failed_iterations_ = 0;
};

}  // namespace tandem::ddp
