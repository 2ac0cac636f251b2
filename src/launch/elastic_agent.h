#pragma once
// This node's part in an elastic job (`tandem run --nnodes MIN:MAX`, Note [Elastic rounds]): it
// serves the rendezvous when the endpoint is one of this machine's addresses and the port is
// free, talks to it as every node does, and tells the supervisor where this node's workers go
// in each round and when to stop them for the next one.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "launch/elastic_rounds.h"
#include "launch/launch_options.h"
#include "launch/rendezvous_client.h"
#include "launch/rendezvous_server.h"

namespace tandem::launch {

class ElasticAgent {
 public:
  /// Throws tandem::Error with one line (endpoint unreachable, another run, another --nnodes or
  /// --max-restarts, `stop()` while connecting).
  ElasticAgent(const LaunchOptions& options, const std::function<bool()>& stop);
  ~ElasticAgent();

  bool hosts_rendezvous() const { return server_ != nullptr; }
  /// Joins the next round and waits for this node's place in it; nullopt when the job finished
  /// while this node waited, or `stop()` said so. `failure`: how this node's workers failed, or
  /// empty; `counted` says whether that was counted as one of the job's restarts. Throws with the
  /// reason when the job failed (restarts used up, too few nodes) or the rendezvous is gone.
  std::optional<Assignment> next_round(const std::string& failure, bool* counted, const std::function<bool()>& stop);
  /// While the workers run or stop (called on every turn, asks at most twice a second, which is
  /// also this node's sign of life): why they must stop for the next round, or "" to go on.
  /// Throws when the rendezvous is gone.
  std::string restart_reason();
  /// This node's workers all succeeded. The serving node goes on serving until every other node
  /// has left (done, or told that the job finished or failed), at most 10 minutes or until
  /// `stop()`, so that none loses its rendezvous before it has finished.
  void finish(const std::function<bool()>& stop);

 private:
  LaunchOptions options_;
  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<RendezvousClient> client_;
  std::chrono::steady_clock::time_point next_poll_{};
};

}  // namespace tandem::launch
