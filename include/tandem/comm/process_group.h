#pragma once
// ProcessGroup: the collectives of one World, on c10d's engines.
//
// Tensors on the CPU go through c10d::ProcessGroupGloo or Tandem's Open MPI backend
// (tandem/comm/cpu_backend.h), CUDA tensors through c10d::ProcessGroupNCCL (where Tandem was built
// with CUDA and a GPU is present). All share the rendezvous store. Destruction shuts the backends
// down before the store.
//
// Every collective gets a sequence number (1, 2, ...), the same on every rank for the same call.
// A failed one says which: "all_reduce of 4 Float on cpu (sum) failed on rank 0 of 2 at
// collective #12: <cause>; rank 1 did not arrive (...)" (docs/reliability.md). With
// TANDEM_DEBUG=DETAIL the ranks also compare each call before making it (tandem/comm/debug.h).
//
// Example:
//   auto world = tandem::comm::World::from_env();
//   auto pg = tandem::comm::ProcessGroup::create(world);
//   auto t = torch::ones({4});
//   pg->all_reduce(t, tandem::comm::ReduceOp::Avg);
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "tandem/comm/cpu_backend.h"
#include "tandem/comm/debug.h"
#include "tandem/comm/rendezvous.h"
#include "tandem/comm/world.h"
#include "tandem/error.h"

namespace tandem::comm {
namespace detail {
struct CollectiveCall;
enum class CollectiveKind : int64_t;
}  // namespace detail

/// PyTorch's default collective timeout for Gloo is 30 minutes; ours is shorter because a job
/// that waits 10 minutes on a dead peer has already failed.
constexpr std::chrono::seconds kDefaultCollectiveTimeout{600};

enum class ReduceOp { Sum, Avg, Max, Min, Product };
const char* to_string(ReduceOp op);

/// Options of ProcessGroup::create.
///
/// Example:
///   auto pg = tandem::comm::ProcessGroup::create(world,
///       tandem::comm::ProcessGroupOptions().timeout(std::chrono::seconds(60)).gloo_threads(4));
struct ProcessGroupOptions {
  /// How long any collective may take before it fails with an error naming it.
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultCollectiveTimeout;
  /// How long to wait for every rank to reach the store.
  TORCH_ARG(std::chrono::milliseconds, rendezvous_timeout) = kDefaultRendezvousTimeout;
  /// Threads Gloo uses to run collectives (the MPI backend runs them on one thread).
  TORCH_ARG(int, gloo_threads) = 2;
  /// Create the NCCL backend, bound to cuda:LOCAL_RANK, when this build has it and that device
  /// exists (Note [Device binding] in src/comm/nccl_device.h).
  TORCH_ARG(bool, use_nccl) = true;
  /// The CPU tensors' backend; unset: TANDEM_CPU_BACKEND, else Auto (MPI under an MPI launcher).
  TORCH_ARG(std::optional<CpuBackend>, cpu_backend) = std::nullopt;
  /// Collective debug level; unset: TANDEM_DEBUG, else TORCH_DISTRIBUTED_DEBUG, else Off.
  TORCH_ARG(std::optional<DebugLevel>, debug) = std::nullopt;
};

class ProcessGroup {
 public:
  /// Rendezvous, then create the backends. Throws tandem::Error.
  static std::shared_ptr<ProcessGroup> create(const World& world,
                                              const ProcessGroupOptions& options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return world_.rank; }
  int size() const { return world_.world_size; }
  const World& world() const { return world_; }
  const ProcessGroupOptions& options() const { return options_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  bool has_nccl() const { return static_cast<bool>(nccl_); }
  /// The CUDA device this rank's NCCL backend is bound to (cuda:LOCAL_RANK, made current by
  /// create()); empty without NCCL.
  std::optional<c10::Device> cuda_device() const;
  /// Why there is no NCCL backend (one line); empty when there is one.
  const std::string& nccl_unavailable() const { return nccl_unavailable_; }
  /// The backend of CPU tensors: Gloo or Mpi (never Auto).
  CpuBackend cpu_backend() const { return cpu_kind_; }
  DebugLevel debug_level() const { return debug_level_; }
  /// The sequence number of the last collective issued (0 before the first).
  uint64_t last_sequence_number() const;

  /// The c10d backend that serves tensors on `device` (Gloo or MPI for CPU, NCCL for CUDA).
  const c10::intrusive_ptr<c10d::Backend>& backend_for(const c10::Device& device) const;

  // Asynchronous all-reduce: the caller waits on the returned work (see wait()). Avg is native
  // on NCCL; Gloo and MPI have none, so on CPU tensors async Avg is refused: pre-divide and Sum,
  // as DDP does.
  c10::intrusive_ptr<c10d::Work> all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);

  // Synchronous collectives; failures and timeouts throw tandem::Error naming the operation.
  // all_reduce Avg on CPU is Sum then one division (exact when the sum is), floating dtypes only.
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  void broadcast(at::Tensor& tensor, int root = 0);
  /// Several tensors from `root` in one message per dtype/device (used to sync model state).
  void broadcast_coalesced(std::vector<at::Tensor>& tensors, int root = 0);
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  void barrier();

  // Flat collectives (Note [Flat collectives] in process_group.cpp), the sharded optimizer's and
  // reducer's: `input` of a reduce-scatter is size() equal shards back to back, and this rank's
  // `output` (input.numel() / size() elements) receives the reduction of its shard over every
  // rank; an all-gather's `output` (size() * input.numel()) receives every rank's `input` in rank
  // order. Same dtype and device, contiguous. Sizes that do not divide are padded by the caller
  // (comm/shard_layout.h). Async Avg follows all_reduce_async: native on NCCL, refused on CPU.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_async(at::Tensor& output, at::Tensor& input,
                                                      ReduceOp op = ReduceOp::Sum);
  void reduce_scatter(at::Tensor& output, at::Tensor& input, ReduceOp op = ReduceOp::Sum);
  c10::intrusive_ptr<c10d::Work> all_gather_into_async(at::Tensor& output, at::Tensor& input);
  void all_gather_into(at::Tensor& output, at::Tensor& input);

  /// Waits for `work`, turning a c10d failure into a one-line tandem::Error about `what` that
  /// names the collective's sequence number and the ranks that did not arrive. On CUDA tensors it
  /// only orders the current stream after the collective (Note [Stream-ordered waits]).
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const;

 private:
  ProcessGroup(World world, ProcessGroupOptions options);
  /// Numbers the next call and, in debug mode, checks it against the other ranks'. Called with
  /// issue_mutex_ held, which stays held until the backend has the call: numbers follow issue order.
  detail::CollectiveCall begin(detail::CollectiveKind kind, const at::Tensor* tensor, int64_t detail);
  /// all_reduce as issued (`wire`) and as the caller asked (`asked`: Avg done as Sum then a division).
  c10::intrusive_ptr<c10d::Work> issue_all_reduce(at::Tensor& tensor, ReduceOp wire, ReduceOp asked);
  c10::intrusive_ptr<c10d::Work> issue_reduce_scatter(at::Tensor& output, at::Tensor& input, ReduceOp wire,
                                                      ReduceOp asked);
  void remember(const c10::intrusive_ptr<c10d::Work>& work, const detail::CollectiveCall& call);
  /// The error for a failed collective: `what`, where, the cause, and the other ranks' whereabouts.
  Error failure(const std::string& what, const detail::CollectiveCall* call, const std::exception& cause) const;

  World world_;
  ProcessGroupOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> cpu_;  // Gloo or MPI
  CpuBackend cpu_kind_ = CpuBackend::Gloo;
  c10::intrusive_ptr<c10d::Backend> nccl_;
  int nccl_device_ = -1;
  std::string nccl_unavailable_;
  DebugLevel debug_level_ = DebugLevel::Off;

  std::mutex issue_mutex_;          // collectives may be issued from autograd threads too
  mutable std::mutex calls_mutex_;
  uint64_t last_seq_ = 0;
  mutable std::deque<std::pair<const c10d::Work*, std::shared_ptr<detail::CollectiveCall>>> in_flight_;
  mutable std::string first_failure_;  // asked once: later failures of the same outage reuse it
  mutable uint64_t first_failure_seq_ = 0;
};

}  // namespace tandem::comm
