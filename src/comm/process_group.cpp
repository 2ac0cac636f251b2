#include "tandem/comm/process_group.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cstdlib>
#include <iterator>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/call_check.h"
#include "comm/collective_call.h"
#include "comm/failure_report.h"
#include "comm/flight_recorder.h"
#include "comm/mpi_backend.h"
#include "comm/nccl_backend.h"
#include "comm/nccl_device.h"
#include "comm/nccl_rules.h"
#include "common/host_buffer_pool.h"
#include "tandem/comm/cuda_info.h"
#include "tandem/comm/net.h"
#include "tandem/error.h"

namespace tandem::comm {
namespace {

using detail::CollectiveCall;
using detail::CollectiveKind;

// Calls remembered for wait() to name: DDP keeps a few buckets in flight, never thousands.
constexpr size_t kMaxInFlight = 1024;

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return c10d::ReduceOp::SUM;
    case ReduceOp::Avg: return c10d::ReduceOp::AVG;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
    case ReduceOp::Product: return c10d::ReduceOp::PRODUCT;
  }
  throw Error("unknown ReduceOp");
}

// The interface Gloo binds: GLOO_SOCKET_IFNAME when the user names one (PyTorch's variable);
// loopback when the job is on this host; else the address on the route to rank 0's host.
std::shared_ptr<gloo::transport::Device> gloo_device(const World& world) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    std::string first(ifname);
    first = first.substr(0, first.find(','));
    return c10d::ProcessGroupGloo::createDeviceForInterface(first);
  }
  if (world.world_size == 1 || (world.single_node() && is_loopback(world.master_addr))) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDeviceForHostname(local_address_towards(world.master_addr));
}

void check_dense(const char* op, const at::Tensor& t) {
  if (!t.defined() || t.is_sparse() || !t.is_contiguous()) {
    throw Error(std::string(op) + " needs a defined, dense, contiguous tensor");
  }
}

// Rank 0 publishes `mine` under `key`; every other rank gets rank 0's value back (rank 0 its own).
std::string rank0_setting(c10d::Store& store, int rank, const std::string& key, const std::string& mine) {
  if (rank == 0) {
    store.set(key, std::vector<uint8_t>(mine.begin(), mine.end()));
    return mine;
  }
  const auto theirs = store.get(key);
  return std::string(theirs.begin(), theirs.end());
}

// The debug mode adds a collective before every call: all ranks must have it, or none.
void agree_on_debug_level(c10d::Store& store, int rank, DebugLevel mine) {
  const std::string text = to_string(mine);
  const std::string other = rank0_setting(store, rank, "tandem/debug_level", text);
  const bool detail_here = mine == DebugLevel::Detail, detail_there = other == to_string(DebugLevel::Detail);
  if (detail_here != detail_there) {
    throw Error("the collective debug level differs between ranks: rank 0 runs with " + other + ", rank " +
                std::to_string(rank) + " with " + text +
                ": set the same TANDEM_DEBUG (or TORCH_DISTRIBUTED_DEBUG) for every rank");
  }
}

// A rank on Gloo and one on MPI would wait for each other forever (MPI's setup has no timeout).
void agree_on_cpu_backend(c10d::Store& store, int rank, CpuBackend mine) {
  const std::string text = to_string(mine);
  const std::string other = rank0_setting(store, rank, "tandem/cpu_backend", text);
  if (other != text) {
    throw Error("the CPU backend differs between ranks: rank 0 uses " + other + ", rank " + std::to_string(rank) +
                " " + text + ": set the same TANDEM_CPU_BACKEND (or ProcessGroupOptions.cpu_backend) for every rank");
  }
}

// NCCL's rules change which programs finish (Note [NCCL's rules on CPU]): all ranks or none.
void agree_on_nccl_rules(c10d::Store& store, int rank, bool mine) {
  const std::string text = mine ? "on" : "off";
  const std::string other = rank0_setting(store, rank, "tandem/nccl_rules", text);
  if (other != text) {
    throw Error("NCCL's rules on CPU are " + other + " on rank 0 and " + text + " on rank " + std::to_string(rank) +
                ": set the same TANDEM_NCCL_RULES (or ProcessGroupOptions.nccl_rules) for every rank");
  }
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
  }
  return "?";
}

ProcessGroup::ProcessGroup(World world, ProcessGroupOptions options)
    : world_(std::move(world)), options_(options) {}

std::shared_ptr<ProcessGroup> ProcessGroup::create(const World& world,
                                                   const ProcessGroupOptions& options) {
  if (options.timeout().count() <= 0) throw Error("ProcessGroupOptions.timeout must be positive");
  if (options.gloo_threads() < 1) throw Error("ProcessGroupOptions.gloo_threads must be >= 1");
  // Note [Threads under srun] in world.cpp.
  if (world.intra_op_threads > 0 && at::get_num_threads() != world.intra_op_threads) {
    at::set_num_threads(world.intra_op_threads);
  }
  std::shared_ptr<ProcessGroup> pg(new ProcessGroup(world, options));
  pg->rank_ = world.rank;
  pg->size_ = world.world_size;
  for (int r = 0; r < world.world_size; ++r) pg->global_ranks_.push_back(r);
  pg->debug_level_ = options.debug() ? *options.debug() : debug_level_from_env();
  pg->store_ = rendezvous(world, options.rendezvous_timeout());
  if (world.world_size > 1) agree_on_debug_level(*pg->store_, world.rank, pg->debug_level_);
  pg->cpu_kind_ = resolve_cpu_backend(options.cpu_backend() ? *options.cpu_backend() : cpu_backend_from_env()).backend;
  if (world.world_size > 1) agree_on_cpu_backend(*pg->store_, world.rank, pg->cpu_kind_);
  pg->nccl_rules_ = options.nccl_rules() ? *options.nccl_rules() : detail::nccl_rules_from_env();
  if (world.world_size > 1) agree_on_nccl_rules(*pg->store_, world.rank, pg->nccl_rules_);
  pg->make_backends(nullptr, 0);
  return pg;
}

void ProcessGroup::make_backends(const c10::intrusive_ptr<c10d::Backend>& mpi_parent, int mpi_color) {
  try {
    if (cpu_kind_ == CpuBackend::Mpi) {
      cpu_ = mpi_parent ? detail::split_mpi_backend(mpi_parent, mpi_color, rank_, size_)
                        : detail::make_mpi_backend(rank_, size_, options_.timeout());
    } else {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(options_.timeout());
      gloo_options->threads = options_.gloo_threads();
      gloo_options->devices.push_back(gloo_device(world_));
      cpu_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("tandem/gloo", store_),
                                                         rank_, size_, gloo_options);
    }
    // Note [Device binding]: before any CUDA work of ours.
    const bool compiled = detail::nccl_compiled();
    const auto device = detail::choose_nccl_device(compiled, options_.use_nccl(), world_.local_rank,
                                                   compiled && options_.use_nccl() ? cuda_device_count() : 0);
    if (device.index >= 0) {
      nccl_ = detail::make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("tandem/nccl", store_), rank_, size_,
                                        device.index, options_.timeout());
      nccl_device_ = device.index;
    } else {
      nccl_unavailable_ = device.unavailable;
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("creating the process group " + (subgroup_ ? "'" + name_ + "' " : std::string()) + "on " +
                describe_rank(rank_) + " failed: " + one_line(e));
  }
  sent_.assign(static_cast<size_t>(size_), 0);
  received_.assign(static_cast<size_t>(size_), 0);
  flight_ = detail::new_flight_record(subgroup_ ? name_ : "world", global_ranks_, world_.rank, world_.world_size);
  if (nccl_rules_) {
    strict_ = std::make_unique<detail::StrictStream>(subgroup_ ? "group '" + name_ + "'" : "the world group",
                                                     options_.timeout());
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::start(const c10::Device& device,
                                                   std::function<c10::intrusive_ptr<c10d::Work>()> issue) {
  // Note [NCCL's rules on CPU]: CPU operations in issue order, one at a time. CUDA ones are NCCL's.
  if (strict_ && !device.is_cuda()) return strict_->submit(std::move(issue));
  return issue();
}

int ProcessGroup::global_rank(int group_rank) const {
  return group_rank >= 0 && group_rank < size_ ? global_ranks_[static_cast<size_t>(group_rank)] : -1;
}

int ProcessGroup::group_rank(int global) const {
  for (int r = 0; r < size_; ++r) {
    if (global_ranks_[static_cast<size_t>(r)] == global) return r;
  }
  return -1;
}

std::string ProcessGroup::describe_rank(int group_rank) const {
  if (!subgroup_) return "rank " + std::to_string(group_rank);
  return "rank " + std::to_string(group_rank) + " of group '" + name_ + "' (global rank " +
         std::to_string(global_rank(group_rank)) + ")";
}

ProcessGroup::~ProcessGroup() {
  // The rules' stream first (its thread uses the CPU backend), then the backends (they hold store
  // connections and worker threads), then the store.
  strict_.reset();
  try {
    if (nccl_) nccl_->shutdown();
  } catch (...) {
  }
  nccl_.reset();
  cpu_.reset();
  store_.reset();
}

std::optional<c10::Device> ProcessGroup::cuda_device() const {
  if (!nccl_) return std::nullopt;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(nccl_device_));
}

const c10::intrusive_ptr<c10d::Backend>& ProcessGroup::backend_for(const c10::Device& device) const {
  if (device.is_cuda()) {
    if (!nccl_) {
      throw Error("a CUDA tensor needs the NCCL backend, which rank " + std::to_string(rank()) +
                  " does not have: " + nccl_unavailable_);
    }
    if (device.has_index() && device.index() != nccl_device_) {
      throw Error("a tensor on " + device.str() + " on rank " + std::to_string(rank()) + ", whose NCCL backend is bound to cuda:" +
                  std::to_string(nccl_device_) + " (LOCAL_RANK=" + std::to_string(world_.local_rank) +
                  "): each rank's CUDA tensors must be on its own device");
    }
    return nccl_;
  }
  if (!device.is_cpu()) throw Error("no backend for tensors on " + device.str());
  return cpu_;
}

uint64_t ProcessGroup::last_sequence_number() const {
  std::lock_guard<std::mutex> hold(calls_mutex_);
  return last_seq_;
}

int64_t ProcessGroup::count_object(const std::string& kind) {
  std::lock_guard<std::mutex> hold(calls_mutex_);
  return objects_[kind]++;
}

ProcessGroup::Traffic ProcessGroup::traffic() const {
  std::lock_guard<std::mutex> hold(calls_mutex_);
  return traffic_;
}

CollectiveCall ProcessGroup::begin(CollectiveKind kind, const at::Tensor* tensor, int64_t detail) {
  CollectiveCall call;
  {
    std::lock_guard<std::mutex> hold(calls_mutex_);
    call = CollectiveCall::of(++last_seq_, kind, tensor, detail);
    if (flight_) call.flight = flight_->issue('C', call.seq, call.describe_with_shape(), -1, tensor);
    ++traffic_.collectives;
    if (tensor) {
      // The whole buffer: an all-gather's input is one rank's part of it.
      const bool part = kind == CollectiveKind::AllGather || kind == CollectiveKind::AllGatherInto;
      traffic_.bytes += static_cast<int64_t>(tensor->nbytes()) * (part ? size() : 1);
    }
  }
  if (debug_level_ == DebugLevel::Detail && size() > 1) {
    try {
      detail::check_same_call(*cpu_, call, size(), options_.timeout());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      Error error = failure(call.describe() + " (its debug check)", &call, e);
      if (flight_) flight_->finish(call.flight, false);
      detail::dump_flight_records(error.what(), /*first_failure_only=*/true);
      throw error;
    }
  }
  return call;
}

void ProcessGroup::remember(const c10::intrusive_ptr<c10d::Work>& work, const CollectiveCall& call) {
  std::lock_guard<std::mutex> hold(calls_mutex_);
  if (in_flight_.size() == kMaxInFlight) in_flight_.pop_front();
  in_flight_.emplace_back(work.get(), std::make_shared<CollectiveCall>(call));
}

Error ProcessGroup::failure(const std::string& what, const CollectiveCall* call, const std::exception& cause) const {
  std::string text = what + " failed on rank " + std::to_string(rank()) + " of " + std::to_string(size());
  if (subgroup_) text += " in group '" + name_ + "' (global rank " + std::to_string(world_.rank) + ")";
  if (call) text += " at collective #" + std::to_string(call->seq);
  text += ": " + one_line(cause);
  if (call && size() > 1) {
    std::string others;
    {
      std::lock_guard<std::mutex> hold(calls_mutex_);
      others = first_failure_;
    }
    // Note [Naming the missing rank]: asked once; the buckets that fail after the first one are
    // the same outage, and must not each wait the report window again.
    if (others.empty()) {
      others = detail::explain_failure(store_, rank(), size(), *call,
                                       world_.use_agent_store ? "the launcher" : "rank 0",
                                       subgroup_ ? global_ranks_ : std::vector<int>{});
      if (others.empty()) others = "every rank was in this collective";
      std::lock_guard<std::mutex> hold(calls_mutex_);
      if (first_failure_.empty()) {
        first_failure_ = others;
        first_failure_seq_ = call->seq;
      }
    } else {
      std::lock_guard<std::mutex> hold(calls_mutex_);
      others += " (as found when collective #" + std::to_string(first_failure_seq_) + " failed)";
    }
    text += "; " + others;
  }
  return Error(text);
}

void ProcessGroup::wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const {
  std::shared_ptr<CollectiveCall> call;
  {
    std::lock_guard<std::mutex> hold(calls_mutex_);
    // Newest first: a work that was never waited for here may have left its address to this one.
    for (auto it = in_flight_.rbegin(); it != in_flight_.rend(); ++it) {
      if (it->first == work.get()) {
        call = it->second;
        in_flight_.erase(std::next(it).base());
        break;
      }
    }
  }
  // Note [Stream-ordered waits]
  // A CUDA collective is waited for as PyTorch's reducer does: wait() without a timeout only makes
  // the current stream wait for NCCL's, so the host goes on queueing work (the optimizer's kernels
  // come after the reduction on that stream). Its timeout is the NCCL watchdog's, set at creation;
  // with TORCH_NCCL_BLOCKING_WAIT=1 wait() blocks and throws, and the error is named here as on
  // CPU. A host wait with a timeout would block the CPU on every bucket, and in c10d >= 2.5 it
  // polls the CUDA event in a busy loop. CPU backends have no watchdog: there wait() is the timeout.
  const bool cuda = detail::is_nccl_work(*work);  // asked of the work: a call may be unremembered
  const auto start = std::chrono::steady_clock::now();
  try {
    if (cuda) {
      work->wait();
    } else {
      work->wait(options_.timeout());
    }
  } catch (const std::exception& e) {
    Error error = failure(what, call.get(), e);
    if (flight_ && call) flight_->finish(call->flight, false);
    detail::dump_flight_records(error.what(), /*first_failure_only=*/true);  // Note [Flight recorder]
    throw error;
  }
  if (flight_ && call) flight_->finish_waited(call->flight, work);  // Note [Device completion]
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> hold(calls_mutex_);
  traffic_.wait_s += waited;
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::all_reduce_async(at::Tensor& tensor, ReduceOp op) {
  check_dense("all_reduce", tensor);
  if (op == ReduceOp::Avg && !tensor.is_cuda()) {
    throw Error(std::string("asynchronous all_reduce Avg is not available on ") + to_string(cpu_kind_) +
                ": pre-divide and use Sum, or call all_reduce()");
  }
  return issue_all_reduce(tensor, op, op);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::issue_all_reduce(at::Tensor& tensor, ReduceOp wire, ReduceOp asked) {
  const auto& backend = backend_for(tensor.device());
  std::lock_guard<std::mutex> issuing(issue_mutex_);
  const CollectiveCall call = begin(CollectiveKind::AllReduce, &tensor, static_cast<int64_t>(asked));
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(wire);
  opts.timeout = options_.timeout();
  auto work = start(tensor.device(), [backend, tensors, opts]() mutable { return backend->allreduce(tensors, opts); });
  remember(work, call);
  return work;
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  check_dense("all_reduce", tensor);
  const bool avg_by_division = op == ReduceOp::Avg && !tensor.is_cuda();
  if (op == ReduceOp::Avg && !at::isFloatingType(tensor.scalar_type())) {
    throw Error(std::string("all_reduce avg needs a floating-point tensor, got ") +
                c10::toString(tensor.scalar_type()));
  }
  // Recorded as the caller's op (the debug check tells avg from sum), issued as Sum on CPU.
  auto work = issue_all_reduce(tensor, avg_by_division ? ReduceOp::Sum : op, op);
  wait(work, CollectiveCall::of(0, CollectiveKind::AllReduce, &tensor, static_cast<int64_t>(op)).describe());
  if (avg_by_division) tensor.div_(size());
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  check_dense("broadcast", tensor);
  if (root < 0 || root >= size()) throw Error("broadcast root " + std::to_string(root) + " is not a rank");
  const auto& backend = backend_for(tensor.device());
  c10::intrusive_ptr<c10d::Work> work;
  CollectiveCall call;
  {
    std::lock_guard<std::mutex> issuing(issue_mutex_);
    call = begin(CollectiveKind::Broadcast, &tensor, root);
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = options_.timeout();
    work = start(tensor.device(), [backend, tensors, opts]() mutable { return backend->broadcast(tensors, opts); });
    remember(work, call);
  }
  wait(work, call.describe());
}

void ProcessGroup::broadcast_coalesced(std::vector<at::Tensor>& tensors, int root) {
  // One flat buffer per (device, dtype), in first-seen order, so every rank builds the same ones.
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    bool placed = false;
    for (auto& g : groups) {
      const auto& head = tensors[g.front()];
      if (head.device() == tensors[i].device() && head.scalar_type() == tensors[i].scalar_type()) {
        g.push_back(i);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({i});
  }
  for (const auto& g : groups) {
    std::vector<at::Tensor> flat_parts;
    flat_parts.reserve(g.size());
    for (size_t i : g) flat_parts.push_back(tensors[i].detach().reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    broadcast(flat, root);
    int64_t offset = 0;
    for (size_t i : g) {
      auto n = tensors[i].numel();
      at::NoGradGuard no_grad;
      tensors[i].copy_(flat.narrow(0, offset, n).view(tensors[i].sizes()));
      offset += n;
    }
  }
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  check_dense("all_gather", tensor);
  const auto& backend = backend_for(tensor.device());
  std::vector<at::Tensor> inputs{tensor};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(tensor));
  c10::intrusive_ptr<c10d::Work> work;
  CollectiveCall call;
  {
    std::lock_guard<std::mutex> issuing(issue_mutex_);
    call = begin(CollectiveKind::AllGather, &tensor, 0);
    c10d::AllgatherOptions opts;
    opts.timeout = options_.timeout();
    work = start(tensor.device(),
                 [backend, outputs, inputs, opts]() mutable { return backend->allgather(outputs, inputs, opts); });
    remember(work, call);
  }
  wait(work, call.describe());
  return outputs[0];
}

// Note [Flat collectives]
// ZeRO shards parameters, gradients and optimizer state as contiguous slices of flat buffers:
// reduce-scatter leaves each rank the averaged gradient of its slice, all-gather puts the
// updated slices back together. Both go through c10d's flat entry points, `_reduce_scatter_base`
// and `_allgather_base`: NCCL's own kernels; on our MPI backend MPI_Reduce_scatter_block and
// MPI_Allgather. Gloo's `_reduce_scatter_base` is an all-reduce of the whole input and a copy of
// this rank's slice (twice a real reduce-scatter's traffic), so on Gloo Tandem reduce-scatters
// itself (Note [Gloo reduce-scatter]). Avg on CPU is Sum and one division of the output, as
// all_reduce does.
//
// Note [Gloo reduce-scatter]
// An all-to-all of the slices (Gloo's alltoall_base, one collective, asynchronous): rank r
// receives every rank's slice r, (W-1)/W of the buffer, as a ring reduce-scatter does; then, when
// the work is waited for, it combines them in rank order into the output. The order is the same
// whatever the buffer's layout, so the result is deterministic. Measured against c10d's path in
// docs/benchmarks.md ("ZeRO-2 beside ZeRO-1 and DDP").
c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_scatter_async(at::Tensor& output, at::Tensor& input, ReduceOp op) {
  if (op == ReduceOp::Avg && !input.is_cuda()) {
    throw Error(std::string("asynchronous reduce_scatter Avg is not available on ") + to_string(cpu_kind_) +
                ": pre-divide and use Sum, or call reduce_scatter()");
  }
  return issue_reduce_scatter(output, input, op, op);
}

void ProcessGroup::reduce_scatter(at::Tensor& output, at::Tensor& input, ReduceOp op) {
  const bool avg_by_division = op == ReduceOp::Avg && !input.is_cuda();
  if (op == ReduceOp::Avg && !at::isFloatingType(input.scalar_type())) {
    throw Error(std::string("reduce_scatter avg needs a floating-point tensor, got ") +
                c10::toString(input.scalar_type()));
  }
  auto work = issue_reduce_scatter(output, input, avg_by_division ? ReduceOp::Sum : op, op);
  wait(work, CollectiveCall::of(0, CollectiveKind::ReduceScatter, &input, static_cast<int64_t>(op)).describe());
  if (avg_by_division) output.div_(size());
}

namespace {

// A flat collective's two tensors: contiguous, alike, and `whole` size() times `part`.
void check_flat(const char* op, const at::Tensor& whole, const at::Tensor& part, int size) {
  check_dense(op, whole);
  check_dense(op, part);
  if (whole.scalar_type() != part.scalar_type() || whole.device() != part.device()) {
    throw Error(std::string(op) + ": input and output differ in dtype or device (" + c10::toString(whole.scalar_type()) +
                " on " + whole.device().str() + ", " + c10::toString(part.scalar_type()) + " on " +
                part.device().str() + ")");
  }
  if (whole.numel() != part.numel() * size) {
    throw Error(std::string(op) + ": the whole buffer has " + std::to_string(whole.numel()) + " elements, not " +
                std::to_string(size) + " x the shard's " + std::to_string(part.numel()) +
                " (pad it: tandem/comm/shard_layout.h)");
  }
}

}  // namespace

namespace {

// Note [Gloo reduce-scatter]: the all-to-all in flight; wait() combines the received slices.
class AllToAllReduceScatter : public c10d::Work {
 public:
  AllToAllReduceScatter(c10::intrusive_ptr<c10d::Work> exchange, at::Tensor received, at::Tensor output, int world,
                        ReduceOp op)
      : exchange_(std::move(exchange)), received_(std::move(received)), output_(std::move(output)), world_(world),
        op_(op) {}
  bool wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> hold(mutex_);
    if (done_) return true;
    if (!exchange_->wait(timeout)) return false;
    at::NoGradGuard no_grad;
    // Flat, whatever the caller's shapes (only the element counts are checked).
    const at::Tensor parts = received_.view({world_, output_.numel()});
    at::Tensor output = output_.view({-1});
    output.copy_(parts[0]);
    for (int r = 1; r < world_; ++r) {
      switch (op_) {
        case ReduceOp::Max: at::maximum_out(output, output, parts[r]); break;
        case ReduceOp::Min: at::minimum_out(output, output, parts[r]); break;
        case ReduceOp::Product: output.mul_(parts[r]); break;
        default: output.add_(parts[r]); break;
      }
    }
    received_.reset();
    done_ = true;
    return true;
  }
  bool isCompleted() override { return done_; }  // the output is ready only once combined
  bool isSuccess() const override { return exchange_->isSuccess(); }
  std::exception_ptr exception() const override { return exchange_->exception(); }

 private:
  std::mutex mutex_;
  c10::intrusive_ptr<c10d::Work> exchange_;
  at::Tensor received_, output_;
  int world_;
  ReduceOp op_;
  std::atomic<bool> done_{false};
};

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroup::issue_reduce_scatter(at::Tensor& output, at::Tensor& input, ReduceOp wire,
                                                                  ReduceOp asked) {
  check_flat("reduce_scatter", input, output, size());
  const auto& backend = backend_for(input.device());
  std::lock_guard<std::mutex> issuing(issue_mutex_);
  const CollectiveCall call = begin(CollectiveKind::ReduceScatter, &input, static_cast<int64_t>(asked));
  c10::intrusive_ptr<c10d::Work> work;
  if (!input.is_cuda() && cpu_kind_ == CpuBackend::Gloo && size() > 1 && wire != ReduceOp::Avg) {
    // Note [Gloo reduce-scatter].
    at::Tensor flat_input = input.view({-1});  // Gloo splits dim 0 into the world size's parts
    at::Tensor received = tandem::detail::scratch_like(flat_input, flat_input.numel());  // Note [Host buffer pool]
    c10d::AllToAllOptions opts;
    opts.timeout = options_.timeout();
    auto exchange = start(input.device(), [backend, received, flat_input, opts]() mutable {
      std::vector<int64_t> equal_splits;
      return backend->alltoall_base(received, flat_input, equal_splits, equal_splits, opts);
    });
    work = c10::make_intrusive<AllToAllReduceScatter>(std::move(exchange), received, output, size(), wire);
  } else {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(wire);
    opts.timeout = options_.timeout();
    work = start(input.device(),
                 [backend, output, input, opts]() mutable { return backend->_reduce_scatter_base(output, input, opts); });
  }
  remember(work, call);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::all_gather_into_async(at::Tensor& output, at::Tensor& input) {
  check_flat("all_gather_into", output, input, size());
  const auto& backend = backend_for(input.device());
  std::lock_guard<std::mutex> issuing(issue_mutex_);
  const CollectiveCall call = begin(CollectiveKind::AllGatherInto, &input, 0);
  c10::intrusive_ptr<c10d::Work> work;
  if (!input.is_cuda() && cpu_kind_ == CpuBackend::Gloo && size() > 1) {
    // Note [Gloo all-gather]: c10d's `_allgather_base` on Gloo gathers into a flat buffer it
    // allocates on Gloo's thread, then copies it into the output. FSDP gathers megabytes per unit
    // twice a step, and those blocks, allocated on one thread and freed on another, spread the
    // process over several heaps (it grew by hundreds of MB a step). An all-to-all whose input is
    // this rank's shard once per rank delivers every rank's shard into the output in rank order,
    // with the same bytes on the wire and no buffer of Gloo's own.
    // The send buffer comes from where the output does (Note [Host buffer pool]: FSDP's pool).
    at::Tensor sent = tandem::detail::scratch_like(output, size() * input.numel());
    sent.view({size(), input.numel()}).copy_(input.reshape({1, -1}).expand({size(), input.numel()}));
    at::Tensor received = output.view({-1});
    c10d::AllToAllOptions opts;
    opts.timeout = options_.timeout();
    work = start(input.device(), [backend, received, sent, opts]() mutable {
      std::vector<int64_t> equal_splits;
      return backend->alltoall_base(received, sent, equal_splits, equal_splits, opts);
    });
  } else {
    c10d::AllgatherOptions opts;
    opts.timeout = options_.timeout();
    work = start(input.device(),
                 [backend, output, input, opts]() mutable { return backend->_allgather_base(output, input, opts); });
  }
  remember(work, call);
  return work;
}

void ProcessGroup::all_gather_into(at::Tensor& output, at::Tensor& input) {
  auto work = all_gather_into_async(output, input);
  wait(work, CollectiveCall::of(0, CollectiveKind::AllGatherInto, &input, 0).describe());
}

void ProcessGroup::barrier() {
  c10::intrusive_ptr<c10d::Work> work;
  CollectiveCall call;
  {
    std::lock_guard<std::mutex> issuing(issue_mutex_);
    call = begin(CollectiveKind::Barrier, nullptr, 0);
    c10d::BarrierOptions opts;
    opts.timeout = options_.timeout();
    work = start(c10::Device(c10::kCPU), [backend = cpu_, opts]() mutable { return backend->barrier(opts); });
    remember(work, call);
  }
  wait(work, call.describe());
}

}  // namespace tandem::comm
