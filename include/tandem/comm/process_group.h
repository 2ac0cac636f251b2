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
// Subgroups (Note [Subgroups] in src/comm/process_group_split.cpp): split() and new_group() make a
// ProcessGroup of some of this group's ranks, with its own backends, its own sequence numbers and
// its own scope of store keys; rank() and size() are the subgroup's, global_rank() translates.
// Point-to-point send/recv (src/comm/point_to_point.cpp) never take a collective sequence number.
//
// Example:
//   auto world = tandem::comm::World::from_env();
//   auto pg = tandem::comm::ProcessGroup::create(world);
//   auto t = torch::ones({4});
//   pg->all_reduce(t, tandem::comm::ReduceOp::Avg);
//   auto pair = pg->split(pg->rank() / 2, "pairs");      // ranks {0,1}, {2,3}, ...
//   if (pair->rank() == 0) pair->send(t, 1); else pair->recv(t, 0);
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <functional>
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
class StrictStream;
class FlightRecord;
}  // namespace detail

/// PyTorch's default collective timeout for Gloo is 30 minutes; ours is shorter because a job
/// that waits 10 minutes on a dead peer has already failed.
constexpr std::chrono::seconds kDefaultCollectiveTimeout{600};

enum class ReduceOp { Sum, Avg, Max, Min, Product };
const char* to_string(ReduceOp op);

/// One operation of ProcessGroup::batch_isend_irecv (PyTorch's dist.P2POp): send `tensor` to, or
/// receive it from, `peer` (a rank of the group the batch is issued on), with `tag`.
struct P2POp {
  enum class Kind { Send, Recv };
  Kind kind = Kind::Send;
  at::Tensor tensor;
  int peer = 0;
  int tag = 0;
  static P2POp send(at::Tensor t, int to, int tag = 0) { return {Kind::Send, std::move(t), to, tag}; }
  static P2POp recv(at::Tensor t, int from, int tag = 0) { return {Kind::Recv, std::move(t), from, tag}; }
};

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
  /// Run the CPU backends under NCCL's rules (Note [NCCL's rules on CPU] in src/comm/nccl_rules.h):
  /// point-to-point without tags, a send complete only once its receive is posted, a group's
  /// operations one at a time in issue order. What hangs on NCCL then hangs (and times out, named)
  /// on CPU. For tests: it serialises every operation. Unset: TANDEM_NCCL_RULES, else off.
  TORCH_ARG(std::optional<bool>, nccl_rules) = std::nullopt;
};

class ProcessGroup {
 public:
  /// Rendezvous, then create the backends. Throws tandem::Error.
  static std::shared_ptr<ProcessGroup> create(const World& world,
                                              const ProcessGroupOptions& options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This process's rank in the group, and the group's size (the World's for create()'s group).
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The job's World (global ranks), also for a subgroup.
  const World& world() const { return world_; }
  /// "world" for create()'s group, else the name given to split() / new_group().
  const std::string& name() const { return name_; }
  /// Whether split() or new_group() made this group (messages then name it and global ranks).
  bool is_subgroup() const { return subgroup_; }
  /// The global rank of this group's rank `group_rank`; -1 past the group.
  int global_rank(int group_rank) const;
  /// The group rank of global rank `global`; -1 when it is not in the group.
  int group_rank(int global) const;
  /// The global ranks of the group's members, in group rank order.
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  /// "rank 1 of group 'tp' (global rank 3)", or "rank 3" in the world group: for messages.
  std::string describe_rank(int group_rank) const;
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
  /// Whether the CPU backends follow NCCL's rules (ProcessGroupOptions::nccl_rules).
  bool nccl_rules() const { return nccl_rules_; }
  /// The sequence number of the last collective issued (0 before the first).
  uint64_t last_sequence_number() const;
  /// Counts one more object of `kind` ("ddp", "fsdp") made on this group and returns how many were
  /// made before it: the same on every member when they make them in the same order (checked by
  /// the objects' agreement, tandem/comm/agreement.h). It scopes their store keys; a process-wide
  /// count would be shifted on one rank by an object it alone made on another group.
  int64_t count_object(const std::string& kind);

  /// What this group's collectives have carried since it was made (point-to-point messages not
  /// counted): how many were issued, the bytes of the buffer each is about (an all-reduce's or a
  /// broadcast's tensor, a reduce-scatter's whole input, an all-gather's whole output: the
  /// convention of `tandem bench`'s sweep), and the host time spent in wait(). On CPU backends
  /// wait() blocks until the collective is done, so that is the time a caller lost to them; on
  /// CUDA it only orders a stream (Note [Stream-ordered waits]) and says little.
  struct Traffic {
    uint64_t collectives = 0;
    int64_t bytes = 0;
    double wait_s = 0;
  };
  Traffic traffic() const;

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

  // Subgroups. Both are collective over this group: every rank calls them, in the same order
  // relative to its other subgroup creations. The subgroup's store keys live under a prefix of
  // their own, so failure reports, the reducer's agreement and the backends' rendezvous never
  // meet another group's keys.

  /// Ranks that pass the same `color` (>= 0) form one group, ordered by their rank here (MPI's
  /// MPI_Comm_split, PyTorch's split_group). A negative color joins no group: nullptr back.
  std::shared_ptr<ProcessGroup> split(int color, const std::string& name = "");
  /// The group of `ranks` (ranks of this group; the new group's ranks follow their order here,
  /// as PyTorch's new_group sorts them). Every rank passes the same list (checked: a one-line
  /// error otherwise); ranks outside it get nullptr.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& name = "");

  // Point-to-point (src/comm/point_to_point.cpp). Peers are ranks of this group. Messages between
  // two ranks with the same tag arrive in the order they were sent; on Gloo and MPI a receive
  // matches only a send of its tag (a tag >= 0), so streams of different tags between the same
  // two ranks need not agree on their order. NCCL has no tags: there every message between two
  // ranks is one stream. They take no collective sequence number, so collectives keep the same
  // numbers on every rank whatever p2p traffic some ranks have. Timeouts and failures name the
  // operation, the peer's group and global rank, the tag if not 0, and which message to or from
  // that peer it was.
  c10::intrusive_ptr<c10d::Work> isend(const at::Tensor& tensor, int to, int tag = 0);
  c10::intrusive_ptr<c10d::Work> irecv(at::Tensor& tensor, int from, int tag = 0);
  void send(const at::Tensor& tensor, int to, int tag = 0);
  void recv(at::Tensor& tensor, int from, int tag = 0);
  /// Issues every operation, then returns their works (wait for each, with wait()). On NCCL the
  /// batch is one coalesced group, so a ring exchange cannot deadlock; on Gloo and MPI every
  /// operation is asynchronous anyway.
  std::vector<c10::intrusive_ptr<c10d::Work>> batch_isend_irecv(std::vector<P2POp>& ops);
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
  /// Creates the CPU (and, where bound, NCCL) backends of a group on `store_`. `mpi_parent`: the
  /// parent's MPI backend a subgroup's communicator is split from (every rank of the parent calls,
  /// members or not); null for create()'s group.
  void make_backends(const c10::intrusive_ptr<c10d::Backend>& mpi_parent, int mpi_color);
  // Note [Connected before returned] in process_group_split.cpp.
  // `connected`: counts this member in and waits for all; else tells them it failed.
  void count_in_connected(bool connected);
  /// split()'s and new_group()'s common part, once every rank knows `members` of its `color`.
  std::shared_ptr<ProcessGroup> subgroup(const std::vector<int>& members, int color, const std::string& name);
  /// A p2p operation's checks and description ("send of 4 Float to rank 1 (global 3) of group 'pp',
  /// message #2 to that rank"); counts the message.
  std::string begin_p2p(const char* op, const at::Tensor& tensor, int peer, int tag, bool sending, uint64_t* flight);
  /// Numbers the next call and, in debug mode, checks it against the other ranks'. Called with
  /// issue_mutex_ held, which stays held until the backend has the call: numbers follow issue order.
  detail::CollectiveCall begin(detail::CollectiveKind kind, const at::Tensor* tensor, int64_t detail);
  /// all_reduce as issued (`wire`) and as the caller asked (`asked`: Avg done as Sum then a division).
  c10::intrusive_ptr<c10d::Work> issue_all_reduce(at::Tensor& tensor, ReduceOp wire, ReduceOp asked);
  c10::intrusive_ptr<c10d::Work> issue_reduce_scatter(at::Tensor& output, at::Tensor& input, ReduceOp wire,
                                                      ReduceOp asked);
  void remember(const c10::intrusive_ptr<c10d::Work>& work, const detail::CollectiveCall& call);
  /// Starts one operation on the backend of `device`: at once, or under NCCL's rules on CPU
  /// through the group's stream (after every operation issued before it).
  c10::intrusive_ptr<c10d::Work> start(const c10::Device& device, std::function<c10::intrusive_ptr<c10d::Work>()> issue);
  /// The error for a failed collective: `what`, where, the cause, and the other ranks' whereabouts.
  Error failure(const std::string& what, const detail::CollectiveCall* call, const std::exception& cause) const;

  World world_;
  ProcessGroupOptions options_;
  int rank_ = 0, size_ = 1;
  std::string name_ = "world";
  bool subgroup_ = false;
  std::vector<int> global_ranks_;    // group rank -> global rank
  int splits_ = 0;                   // subgroups made from this one: the next one's key scope
  std::vector<uint64_t> sent_, received_;  // p2p messages per peer, for messages
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> cpu_;  // Gloo or MPI
  CpuBackend cpu_kind_ = CpuBackend::Gloo;
  c10::intrusive_ptr<c10d::Backend> nccl_;
  int nccl_device_ = -1;
  std::string nccl_unavailable_;
  DebugLevel debug_level_ = DebugLevel::Off;
  bool nccl_rules_ = false;
  std::unique_ptr<detail::StrictStream> strict_;  // under NCCL's rules
  std::shared_ptr<detail::FlightRecord> flight_;   // Note [Flight recorder]; null when off

  std::mutex issue_mutex_;          // collectives may be issued from autograd threads too
  mutable std::mutex calls_mutex_;
  uint64_t last_seq_ = 0;
  std::map<std::string, int64_t> objects_;  // count_object(); under calls_mutex_
  mutable Traffic traffic_;         // under calls_mutex_
  mutable std::deque<std::pair<const c10d::Work*, std::shared_ptr<detail::CollectiveCall>>> in_flight_;
  mutable std::string first_failure_;  // asked once: later failures of the same outage reuse it
  mutable uint64_t first_failure_seq_ = 0;
};

}  // namespace tandem::comm
