// Note [Join]: uneven inputs, PyTorch's Join context manager for DDP.
//
// While a rank is inside join(), every training forward first all-reduces two counters, the
// ranks still training and those of them whose forward syncs: [1, sync?1:0] from an active rank.
// A rank whose loop has ended all-reduces [0, 0] in a loop instead, and reads the sums:
//   - no rank active: everyone is done, leave the loop;
//   - active ranks sync this iteration: stand in for it. Issue the same collectives an active
//     rank issues, in the same order (the one-time bucket rebuild broadcast, the buffer
//     broadcast, every bucket's all-reduce with a zero contribution, the unused-parameter map),
//     so that theirs complete. The average stays divided by the whole world size (PyTorch's
//     default, divide_by_initial_world_size=True): a rank out of data weighs zero;
//   - active ranks are inside no_sync(): nothing to match, wait for the next iteration.
// When every rank is done, a rank that was active to the end (the highest such rank) broadcasts
// its parameters and buffers: ranks that stopped early missed optimizer steps and must not keep
// their stale weights. Optimizer state is not synchronised (as in PyTorch).
//
// The cost is one all-reduce of two integers per training forward, only inside join().
#include <ATen/ATen.h>

#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/error.h"

namespace tandem::ddp::detail {

int64_t DdpCore::join(const std::function<void()>& body) {
  TANDEM_CHECK(!joining_, "DDP: join() is already active for this module; it does not nest");
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

void DdpCore::announce_active() {
  at::Tensor counts = at::tensor({int64_t{1}, int64_t{sync_ ? 1 : 0}}, at::kLong);
  pg_->all_reduce(counts, comm::ReduceOp::Sum);
  const int64_t active = counts[0].item<int64_t>(), syncing = counts[1].item<int64_t>();
  TANDEM_CHECK(syncing == 0 || syncing == active, "DDP join: in this iteration ", syncing, " of the ", active,
               " training ranks sync their gradients and the others are inside no_sync(): every rank must "
               "use no_sync() for the same iterations");
}

int64_t DdpCore::shadow_until_all_joined() {
  int64_t shadowed = 0;
  bool first = true;
  for (;;) {
    at::Tensor counts = at::zeros({2}, at::kLong);
    pg_->all_reduce(counts, comm::ReduceOp::Sum);
    const int64_t active = counts[0].item<int64_t>(), syncing = counts[1].item<int64_t>();
    if (active == 0) break;
    first = false;
    if (syncing == 0) continue;  // they accumulate under no_sync(): no collective to match
    TANDEM_CHECK(syncing == active, "DDP join: in this iteration ", syncing, " of the ", active,
                 " training ranks sync their gradients and the others are inside no_sync(): every rank must "
                 "use no_sync() for the same iterations");
    ++shadowed;
    reducer_->prepare_for_forward(/*synced=*/true);
    if (options_.broadcast_buffers() && !buffers_.empty()) pg_->broadcast_coalesced(buffers_, 0);
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
