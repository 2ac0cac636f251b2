#pragma once
// One launcher's connection to the elastic rendezvous (rendezvous_server.h): the requests of
// elastic_protocol.h as calls. The connection stays open for the whole job; when it breaks, the
// node that served it is gone and the call throws.
#include <chrono>
#include <string>
#include <vector>

#include "launch/elastic_rounds.h"

namespace tandem::launch {

class RendezvousClient {
 public:
  /// Connects to host:port, retrying until `patience` has passed (the serving launcher may start
  /// later), and says hello. Throws tandem::Error: unreachable, or refused (another run id,
  /// another --nnodes, not a Tandem rendezvous).
  RendezvousClient(const std::string& host, int port, const std::string& run_id, const std::string& nnodes_spec,
                   std::chrono::milliseconds patience);
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  /// Asks for a place in the next round; true when the server counts this as a failure restart.
  bool join(const NodeOffer& offer);
  PollAnswer poll();
  void done();

 private:
  std::vector<std::string> request(const std::vector<std::string>& fields);

  std::string where_;
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace tandem::launch
