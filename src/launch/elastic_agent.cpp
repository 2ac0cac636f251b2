#include "launch/elastic_agent.h"

#include <thread>

#include "tandem/comm/net.h"
#include "tandem/error.h"

namespace tandem::launch {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

ElasticAgent::ElasticAgent(const LaunchOptions& o, const std::function<bool()>& stop) : options_(o) {
  // The first launcher on the endpoint's host serves; any other (another host, or a second
  // launcher on the same one) finds the address foreign or the port taken, and connects.
  const int fd = comm::listen_if_free_here(o.master_addr, o.master_port);
  ElasticConfig config = o.rdzv;
  config.max_restarts = o.max_restarts;
  if (fd >= 0) server_ = std::make_unique<RendezvousServer>(fd, config, o.run_id, o.nnodes_spec);
  client_ = std::make_unique<RendezvousClient>(o.master_addr, o.master_port, o.run_id, o.nnodes_spec, o.max_restarts,
                                               o.rdzv.join_timeout, stop);
}

ElasticAgent::~ElasticAgent() = default;

std::optional<Assignment> ElasticAgent::next_round(const std::string& failure, bool* counted,
                                                  const std::function<bool()>& stop) {
  NodeOffer offer;
  offer.nproc = options_.nproc;
  offer.hosts_server = server_ != nullptr;
  const bool local = comm::is_loopback(options_.master_addr);
  offer.addr = local ? "127.0.0.1" : comm::local_address_towards(options_.master_addr);
  // Rank 0's store of the round, should this node be node 0: a fresh port every round, so that
  // no worker ever reads a key of the round before.
  offer.port = comm::pick_free_port(local ? "127.0.0.1" : "0.0.0.0");
  *counted = client_->join(offer, failure);
  for (;;) {
    if (stop()) return std::nullopt;
    const PollAnswer answer = client_->poll();
    switch (answer.kind) {
      case PollAnswer::Kind::Go: return answer.assignment;
      case PollAnswer::Kind::Finished: return std::nullopt;
      case PollAnswer::Kind::Failed: throw Error(answer.why);
      case PollAnswer::Kind::Restart: client_->join(offer, ""); break;  // the round moved on while joining
      case PollAnswer::Kind::Wait: break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::string ElasticAgent::restart_reason() {
  const auto now = Clock::now();
  if (now < next_poll_) return "";
  next_poll_ = now + std::chrono::milliseconds(500);
  const PollAnswer answer = client_->poll();
  if (answer.kind == PollAnswer::Kind::Restart) return answer.why;
  if (answer.kind == PollAnswer::Kind::Failed) return "the rendezvous failed: " + answer.why;
  return "";
}

void ElasticAgent::finish(const std::function<bool()>& stop) {
  try {
    client_->done();
  } catch (const Error&) {
    return;  // the serving node finished first and is gone: nothing left to tell it
  }
  if (!server_) return;
  const auto deadline = Clock::now() + std::chrono::minutes(10);
  while (server_->nodes_connected() > 1 && Clock::now() < deadline && !stop()) {
    try {
      client_->poll();  // this node's own sign of life
    } catch (const Error&) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace tandem::launch
