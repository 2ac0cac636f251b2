// Note [Join]: uneven inputs, PyTorch's Join context manager for DDP.
//
// While a rank is inside join(), every training forward first all-reduces the ranks still
// training, those of them whose forward syncs, and which ones they are: [1, sync?1:0, one-hot of
// the rank] from an active rank. A rank whose loop has ended all-reduces zeros in a loop instead,
// and reads the sums:
//   - no rank active: everyone is done, leave the loop;
//   - active ranks sync this iteration: stand in for it. Issue the same collectives an active
//     rank issues, in the same order (the one-time bucket rebuild broadcast, the buffer
//     broadcast from the highest rank still training (PyTorch's choice: a rank out of data has
//     stale buffers), every bucket's all-reduce with a zero contribution, the unused-parameter map),
//     so that theirs complete. The average stays divided by the whole world size (PyTorch's
//     default, divide_by_initial_world_size=True): a rank out of data weighs zero;
//   - active ranks are inside no_sync(): nothing to match, wait for the next iteration.
// When every rank is done, a rank that was active to the end (the highest such rank) broadcasts
// its parameters and buffers: ranks that stopped early missed optimizer steps and must not keep
// their stale weights. Optimizer state is not synchronised (as in PyTorch). The final sync always
// includes the buffers (PyTorch follows broadcast_buffers there); parameters and buffers are the
// ones the module had when DDP was constructed.
//
// The cost is one all-reduce of 2 + world-size integers per training forward, only inside join().
#include <ATen/ATen.h>

#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/error.h"

namespace tandem::ddp::detail {

int64_t DdpCore::join(const std::function<void()>& body) {
  TANDEM_CHECK(!joining_, "DDP: join() is already active for this module; it does not nest");
  // A joined rank mirrors the reducer's collectives only; a reduction may refuse it (ZeRO-2's step
  // issues collectives of its own).
  reducer_->bucket_reduction().check_join();
  if (pg_->size() == 1) {
    body();
    return 0;
  }
  joining_ = true;
  try {
    body();
  } catch (...) {
    joining_ = false;  // the others will fail on their next collective, naming this rank
    throw;
  }
  joining_ = false;
  return shadow_until_all_joined();
}

DdpCore::JoinCounts DdpCore::exchange_join_counts(bool active) {
  const int world = pg_->size();
  at::Tensor counts = at::zeros({2 + world}, at::kLong);
  if (active) {
    auto* c = counts.data_ptr<int64_t>();
    c[0] = 1;
    c[1] = sync_ ? 1 : 0;
    c[2 + pg_->rank()] = 1;
  }
  pg_->all_reduce(counts, comm::ReduceOp::Sum);
  const auto* c = counts.data_ptr<int64_t>();
  JoinCounts result;
  result.active = c[0];
  result.syncing = c[1];
  for (int r = world - 1; r >= 0 && result.highest_active < 0; --r) {
    if (c[2 + r] > 0) result.highest_active = r;
  }
  TANDEM_CHECK(result.syncing == 0 || result.syncing == result.active, "DDP join: in this iteration ", result.syncing,
               " of the ", result.active, " training ranks sync their gradients and the others are inside no_sync(): ",
               "every rank must use no_sync() for the same iterations");
  buffer_source_ = result.highest_active < 0 ? 0 : result.highest_active;
  return result;
}

void DdpCore::announce_active() { (void)exchange_join_counts(/*active=*/true); }

int64_t DdpCore::shadow_until_all_joined() {
  int64_t shadowed = 0;
  bool first = true;
  for (;;) {
    const JoinCounts counts = exchange_join_counts(/*active=*/false);
    if (counts.active == 0) break;
    first = false;
    if (counts.syncing == 0) continue;  // they accumulate under no_sync(): no collective to match
    ++shadowed;
    reducer_->prepare_for_forward(/*synced=*/true);
    if (options_.broadcast_buffers() && !buffers_.empty()) pg_->broadcast_coalesced(buffers_, buffer_source_);
    reducer_->shadow_iteration();
  }
  // `first`: the loop ended at once, so this rank trained until every rank was done.
  sync_final_model(first);
  return shadowed;
}

void DdpCore::sync_final_model(bool last_to_join) {
  at::Tensor source = at::scalar_tensor(last_to_join ? pg_->rank() : -1, at::kLong);
  pg_->all_reduce(source, comm::ReduceOp::Max);
  pg_->broadcast_coalesced(state_, static_cast<int>(source.item<int64_t>()));
}

}  // namespace tandem::ddp::detail
