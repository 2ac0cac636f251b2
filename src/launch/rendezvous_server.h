#pragma once
// The elastic rendezvous's server: ElasticRounds (Note [Elastic rounds]) behind a TCP socket,
// served by a thread of the launcher whose host is the rendezvous endpoint
// (`--master-addr:--master-port`), for the whole job. Every launcher, this one included, talks
// to it as a client (rendezvous_client.h); elastic_protocol.h is the wire format.
#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "launch/elastic_rounds.h"

namespace tandem::launch {

class RendezvousServer {
 public:
  /// Serves on `listen_fd` (bound and listening; taken over) a run of id `run_id` whose launchers
  /// were started with `--nnodes nnodes_spec`.
  RendezvousServer(int listen_fd, ElasticConfig config, std::string run_id, std::string nnodes_spec);
  // (The launchers must also agree on --max-restarts: config.max_restarts.)
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  /// Launchers connected now, this node's own included.
  int nodes_connected();

 private:
  struct Connection;
  void serve();
  /// The answer line to one request line of `c`; empty to close the connection. `close` is set
  /// when the connection ends after the answer (a refusal).
  std::string answer(Connection& c, const std::string& line, bool& close);

  int listen_fd_;
  int wake_[2] = {-1, -1};
  std::string run_id_, nnodes_spec_;
  int max_restarts_;
  std::mutex mutex_;
  ElasticRounds rounds_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tandem::launch
