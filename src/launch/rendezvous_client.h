#pragma once
// One launcher's connection to the elastic rendezvous (rendezvous_server.h): the requests of
// elastic_protocol.h as calls. The connection stays open for the whole job; when it breaks, the
// node that served it is gone and the call throws.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "launch/elastic_rounds.h"

namespace tandem::launch {

class RendezvousClient {
 public:
  /// Connects to host:port, retrying until `patience` has passed or `stop()` says so (the
  /// serving launcher may start later), and says hello. Throws tandem::Error: unreachable,
  /// stopped, or refused (another run id, --nnodes or --max-restarts; not a Tandem rendezvous).
  RendezvousClient(const std::string& host, int port, const std::string& run_id, const std::string& nnodes_spec,
                   int max_restarts, std::chrono::milliseconds patience, const std::function<bool()>& stop);
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  /// Asks for a place in the next round, after a failure of this node's workers when `failure`
  /// (one line) is not empty; true when the server counted it as one of the job's restarts.
  bool join(const NodeOffer& offer, const std::string& failure);
  PollAnswer poll();
  void done();

 private:
  std::vector<std::string> request(const std::vector<std::string>& fields);

  std::string where_;
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace tandem::launch
