#include "tandem/comm/process_group.h"

#include <cstdlib>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/nccl_backend.h"
#include "tandem/comm/net.h"
#include "tandem/error.h"

namespace tandem::comm {
namespace {

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

std::string describe(const char* op, const at::Tensor& t) {
  return std::string(op) + " of " + std::to_string(t.numel()) + " " +
         std::string(c10::toString(t.scalar_type())) + " on " + t.device().str();
}

void check_dense(const char* op, const at::Tensor& t) {
  if (!t.defined() || t.is_sparse() || !t.is_contiguous()) {
    throw Error(std::string(op) + " needs a defined, dense, contiguous tensor");
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
  std::shared_ptr<ProcessGroup> pg(new ProcessGroup(world, options));
  pg->store_ = rendezvous(world, options.rendezvous_timeout());
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout());
    gloo_options->threads = options.gloo_threads();
    gloo_options->devices.push_back(gloo_device(world));
    pg->gloo_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("tandem/gloo", pg->store_), world.rank,
        world.world_size, gloo_options);
    if (options.use_nccl()) {
      pg->nccl_ = detail::make_nccl_backend(
          c10::make_intrusive<c10d::PrefixStore>("tandem/nccl", pg->store_), world.rank,
          world.world_size, options.timeout());
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("creating the process group on rank " + std::to_string(world.rank) +
                " failed: " + one_line(e));
  }
  return pg;
}

ProcessGroup::~ProcessGroup() {
  // Backends first (they hold store connections and worker threads), then the store.
  try {
    if (nccl_) nccl_->shutdown();
  } catch (...) {
  }
  nccl_.reset();
  gloo_.reset();
  store_.reset();
}

const c10::intrusive_ptr<c10d::Backend>& ProcessGroup::backend_for(const c10::Device& device) const {
  if (device.is_cuda()) {
    if (!nccl_) {
      throw Error("a CUDA tensor needs the NCCL backend, which this process group does not have "
                  "(built without CUDA, no GPU visible, or use_nccl=false)");
    }
    return nccl_;
  }
  if (!device.is_cpu()) throw Error("no backend for tensors on " + device.str());
  return gloo_;
}

void ProcessGroup::wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const {
  try {
    work->wait(options_.timeout());
  } catch (const std::exception& e) {
    throw Error(what + " failed on rank " + std::to_string(rank()) + " of " +
                std::to_string(size()) + ": " + one_line(e));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::all_reduce_async(at::Tensor& tensor, ReduceOp op) {
  check_dense("all_reduce", tensor);
  if (op == ReduceOp::Avg && !tensor.is_cuda()) {
    throw Error("asynchronous all_reduce Avg is not available on Gloo: pre-divide and use Sum, "
                "or call all_reduce()");
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = options_.timeout();
  return backend_for(tensor.device())->allreduce(tensors, opts);
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  check_dense("all_reduce", tensor);
  const bool avg_by_division = op == ReduceOp::Avg && !tensor.is_cuda();
  if (op == ReduceOp::Avg && !at::isFloatingType(tensor.scalar_type())) {
    throw Error(std::string("all_reduce avg needs a floating-point tensor, got ") +
                c10::toString(tensor.scalar_type()));
  }
  auto work = all_reduce_async(tensor, avg_by_division ? ReduceOp::Sum : op);
  wait(work, describe("all_reduce", tensor) + " (" + to_string(op) + ")");
  if (avg_by_division) tensor.div_(size());
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  check_dense("broadcast", tensor);
  if (root < 0 || root >= size()) throw Error("broadcast root " + std::to_string(root) + " is not a rank");
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = options_.timeout();
  wait(backend_for(tensor.device())->broadcast(tensors, opts), describe("broadcast", tensor));
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
  std::vector<at::Tensor> inputs{tensor};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(tensor));
  c10d::AllgatherOptions opts;
  opts.timeout = options_.timeout();
  wait(backend_for(tensor.device())->allgather(outputs, inputs, opts), describe("all_gather", tensor));
  return outputs[0];
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = options_.timeout();
  wait(gloo_->barrier(opts), "barrier");
}

}  // namespace tandem::comm
