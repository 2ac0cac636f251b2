#pragma once
// Internal: NCCL's rules on the CPU backends (TANDEM_NCCL_RULES=1, ProcessGroupOptions::nccl_rules).
//
// Note [NCCL's rules on CPU]
// Gloo and MPI forgive what NCCL does not, so a design that leans on them passes every CPU test
// and hangs on the first GPU. Three of NCCL's rules matter to a program's order of operations:
//  1. No tags. A receive takes the next message from its peer, whatever the sender meant it for.
//  2. A send does not complete before its receive is posted (large messages have no buffer to go
//     to; small ones may, but nothing may rely on that), like MPI_Ssend.
//  3. The operations of a group run on one stream: each starts when the one issued before it has
//     completed, collectives and point-to-point alike. Only a batch (batch_isend_irecv, NCCL's
//     group call) runs its operations together.
// Under the rules, a group's CPU operations go through one queue with one thread (the stream):
// an item is one collective, or one batch of sends and receives, issued and waited for before the
// next starts. Point-to-point ignores the caller's tags (every message to a peer is one FIFO on the
// group), and each send first waits for a token its receiver sends when the receive is posted
// (Note [Send tokens]). A program that would deadlock on NCCL deadlocks here, and the timeout names
// the operation that waited. The rules cost a round trip per message and all overlap between a
// group's operations: for tests, not for production runs.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace tandem::comm::detail {

/// TANDEM_NCCL_RULES: "1"/"on"/"true" or "0"/"off"/"false" (empty or unset: off). Throws
/// tandem::Error for another value.
bool nccl_rules_from_env();

/// One group's stream under NCCL's rules (Note [NCCL's rules on CPU]).
class StrictStream {
 public:
  /// `what`: the group, for messages ("group 'pp'").
  StrictStream(std::string what, std::chrono::milliseconds timeout);
  ~StrictStream();
  StrictStream(const StrictStream&) = delete;
  StrictStream& operator=(const StrictStream&) = delete;

  /// Queues `start` (which issues one operation on the backend and returns its work); the work
  /// returned completes once `start`'s work has, after every item queued before it.
  c10::intrusive_ptr<c10d::Work> submit(std::function<c10::intrusive_ptr<c10d::Work>()> start);

  struct P2P {
    bool send = true;
    at::Tensor tensor;
    int peer = 0;
    std::string what;  // for a timeout: "send of 4 Float to rank 1"
  };
  /// Queues a batch of sends and receives that run together (Note [Send tokens]); the work
  /// returned completes when every one of them has.
  c10::intrusive_ptr<c10d::Work> submit_batch(const c10::intrusive_ptr<c10d::Backend>& backend, std::vector<P2P> ops);

 private:
  class Item;
  void run();
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::pair<std::function<void()>, c10::intrusive_ptr<Item>>> queue_;
  std::string broken_;  // why an earlier item failed: every later one fails with it, as NCCL's abort
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tandem::comm::detail
