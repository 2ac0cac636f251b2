// ProcessGroup's point-to-point operations: send, recv, and batches of both.
//
// Note [Point-to-point and the collective sequence]
// Collectives are numbered in issue order, the same number on every rank (Note [Collective
// sequence]); that is what lets a failure say "collective #12" and mean one call of the job. A
// send involves two ranks only, so if it took a number the ranks that sent nothing would number
// their next collective differently. P2P operations therefore never touch the collective counter;
// each pair of ranks counts its own messages instead (sent_[peer], received_[peer], all tags
// together), which is what a failure names: "message #3 to that rank". A send matches the receive
// of the same pair and tag in order (Gloo and MPI match by tag; NCCL has none, so there all of a
// pair's messages are one stream, and programs that use tags must keep them in one order too).
#include <algorithm>

#include <ATen/ATen.h>

#include "comm/flight_recorder.h"
#include "comm/nccl_backend.h"
#include "comm/nccl_rules.h"
#include "tandem/comm/process_group.h"
#include "tandem/error.h"

namespace tandem::comm {
namespace {

// A p2p work whose wait() turns a backend's failure or timeout into one line that names the
// operation, the peer (group and global rank) and the message's number.
class PointToPointWork : public c10d::Work {
 public:
  PointToPointWork(int rank, c10::intrusive_ptr<c10d::Work> inner, std::string what, std::chrono::milliseconds timeout,
                   std::shared_ptr<detail::FlightRecord> flight, uint64_t flight_id)
      : c10d::Work(rank, inner->retrieveOpType()),
        inner_(std::move(inner)),
        what_(std::move(what)),
        timeout_(timeout),
        flight_(std::move(flight)),
        flight_id_(flight_id) {}

  bool wait(std::chrono::milliseconds timeout) override {
    try {
      // Note [Stream-ordered waits]: a CUDA work only orders the current stream after it.
      const bool done = comm::detail::is_nccl_work(*inner_) ? inner_->wait()
                                                           : inner_->wait(timeout == kNoTimeout ? timeout_ : timeout);
      if (flight_) flight_->finish_waited(flight_id_, inner_);  // Note [Device completion]
      return done;
    } catch (const std::exception& e) {
      const Error error(what_ + ": " + one_line(e));
      if (flight_) flight_->finish(flight_id_, false);
      detail::dump_flight_records(error.what(), /*first_failure_only=*/true);  // Note [Flight recorder]
      throw error;
    }
  }
  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  void synchronize() override { inner_->synchronize(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<detail::FlightRecord> flight_;
  uint64_t flight_id_;
};

}  // namespace

std::string ProcessGroup::begin_p2p(const char* op, const at::Tensor& tensor, int peer, int tag, bool sending,
                                    uint64_t* flight) {
  if (!tensor.defined() || tensor.is_sparse() || !tensor.is_contiguous()) {
    throw Error(std::string(op) + " needs a defined, dense, contiguous tensor");
  }
  TANDEM_CHECK(peer >= 0 && peer < size(), op, (sending ? " to" : " from"), " rank ", peer,
               ": the group", (subgroup_ ? " '" + name_ + "'" : std::string()), " has ranks 0 to ", size() - 1);
  TANDEM_CHECK(peer != rank(), op, (sending ? " to" : " from"), " rank ", peer, ": that is this rank itself");
  TANDEM_CHECK(tag >= 0, op, " with tag ", tag, ": tags are 0 or more");
  uint64_t number = 0;
  {
    std::lock_guard<std::mutex> hold(calls_mutex_);
    number = ++(sending ? sent_ : received_)[static_cast<size_t>(peer)];
  }
  if (flight_) *flight = flight_->issue(sending ? 'S' : 'R', number, op, global_rank(peer), &tensor);
  return std::string(op) + " of " + std::to_string(tensor.numel()) + " " + c10::toString(tensor.scalar_type()) +
         " on " + tensor.device().str() + (sending ? " to " : " from ") + describe_rank(peer) +
         (tag != 0 ? " with tag " + std::to_string(tag) : std::string()) + ", message #" +
         std::to_string(number) + (sending ? " to" : " from") + " that rank, failed on " + describe_rank(rank());
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::isend(const at::Tensor& tensor, int to, int tag) {
  std::vector<P2POp> one{P2POp::send(tensor, to, tag)};
  return batch_isend_irecv(one).front();
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::irecv(at::Tensor& tensor, int from, int tag) {
  std::vector<P2POp> one{P2POp::recv(tensor, from, tag)};
  return batch_isend_irecv(one).front();
}

void ProcessGroup::send(const at::Tensor& tensor, int to, int tag) { isend(tensor, to, tag)->wait(); }

void ProcessGroup::recv(at::Tensor& tensor, int from, int tag) { irecv(tensor, from, tag)->wait(); }

std::vector<c10::intrusive_ptr<c10d::Work>> ProcessGroup::batch_isend_irecv(std::vector<P2POp>& ops) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  if (ops.empty()) return works;
  const c10::Device device = ops.front().tensor.defined() ? ops.front().tensor.device() : c10::Device(c10::kCPU);
  for (const auto& op : ops) {
    TANDEM_CHECK(!op.tensor.defined() || op.tensor.device() == device,
                 "batch_isend_irecv: every tensor of a batch must be on one device, got ", device.str(), " and ",
                 op.tensor.device().str());
  }
  const auto& backend = backend_for(device);
  const bool coalesce = device.is_cuda() && ops.size() > 1;  // one NCCL group: a ring cannot deadlock
  std::lock_guard<std::mutex> issuing(issue_mutex_);
  std::vector<std::string> what;
  std::vector<uint64_t> flight(ops.size(), UINT64_MAX);
  for (size_t k = 0; k < ops.size(); ++k) {
    const bool sending = ops[k].kind == P2POp::Kind::Send;
    what.push_back(begin_p2p(sending ? "send" : "recv", ops[k].tensor, ops[k].peer, ops[k].tag, sending, &flight[k]));
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> issued;
  if (strict_ && !device.is_cuda()) {
    // Note [NCCL's rules on CPU]: the batch is one item of the group's stream; tags are not used.
    std::vector<detail::StrictStream::P2P> batch;
    for (size_t k = 0; k < ops.size(); ++k) {
      batch.push_back({ops[k].kind == P2POp::Kind::Send, ops[k].tensor, ops[k].peer, what[k]});
    }
    issued.assign(ops.size(), strict_->submit_batch(backend, std::move(batch)));
  }
  size_t i = issued.empty() ? 0 : ops.size();
  try {  // a backend may refuse at once (a pair closed by an earlier timeout): named as a wait would
    if (coalesce) backend->startCoalescing();
    for (; i < ops.size(); ++i) {
      std::vector<at::Tensor> tensors{ops[i].tensor};
      issued.push_back(ops[i].kind == P2POp::Kind::Send ? backend->send(tensors, ops[i].peer, ops[i].tag)
                                                         : backend->recv(tensors, ops[i].peer, ops[i].tag));
    }
    if (coalesce) {
      auto group = backend->endCoalescing();
      for (auto& w : issued) w = group;
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(what[std::min(i, what.size() - 1)] + ": " + one_line(e));
  }
  for (size_t k = 0; k < issued.size(); ++k) {
    works.push_back(
        c10::make_intrusive<PointToPointWork>(rank(), issued[k], what[k], options_.timeout(), flight_, flight[k]));
  }
  return works;
}

}  // namespace tandem::comm
