#pragma once
// The elastic rendezvous of `tandem run --nnodes MIN:MAX`: which nodes form each round of the job.
// A pure state machine, time passed in, so that every rule is unit-tested without sockets; the
// server (rendezvous_server.h) feeds it the requests of the nodes' launchers.
//
// Note [Elastic rounds]
// - A round is one run of the workers with a fixed set of nodes. Round 0 opens when the server
//   starts. Nodes join the open round; it closes when MAX nodes are in, or when at least MIN are
//   in and no node has joined for `last_call` (torchrun's last_call_timeout), and only once every
//   node of the round before that is still connected has joined again (one that is stopping its
//   workers, saving a checkpoint inside its grace period, is not left behind). Fewer than MIN
//   nodes for `join_timeout` after the round opened fails the job.
// - A closed round's nodes poll. They are told to restart, and join the next round, when a node
//   of the round is lost (its launcher's connection closed, or silent for `keep_alive`), when a
//   node asks to join (it waits until then; "a node that comes back joins at the next restart"),
//   or when another node of the round joined the next round first (its workers failed). A node
//   that asks to join a round of MAX nodes waits for a place, without restarting anyone.
// - Failures are counted for the job, not per node: the node whose workers failed first opens
//   the next round and that counts as one restart; the other nodes' workers, failing with it,
//   do not count. Past --max-restarts the job fails on every node. A node whose workers fail
//   after another node's have finished fails the job too: the training is over, there is no
//   round to restart.
// - When the next round has more than MAX nodes, the serving node comes first, then the nodes
//   of the round before, then the others; the rest wait.
// - The first node of the round to join again opens the next round; the nodes that were waiting
//   are in it from the start. Rounds are numbered 0, 1, 2, ... for the whole job: the workers
//   see the round as TORCHELASTIC_RESTART_COUNT, the same on every node.
// - Node ranks follow the order of joining, except that the node hosting the server (which the
//   job cannot lose) is node 0; ranks are numbered node by node, so nodes may differ in their
//   number of workers. Node 0 names rank 0's store (its address and a port it picked).
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tandem::launch {

struct ElasticConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds last_call{30000};
  std::chrono::milliseconds join_timeout{600000};
  std::chrono::milliseconds keep_alive{15000};
  int max_restarts = 0;  // failures of workers the job may restart from, all nodes together
};

/// What a node brings to a round: its workers and, should it be node 0, where rank 0's store
/// will listen.
struct NodeOffer {
  int nproc = 1;
  std::string addr;
  int port = 0;
  bool hosts_server = false;
};

/// A node's place in a closed round.
struct Assignment {
  int round = 0;
  int node_rank = 0;
  int nnodes = 1;
  int world_size = 1;
  int rank_offset = 0;  // global rank of this node's local rank 0
  std::string master_addr;
  int master_port = 0;
};

struct PollAnswer {
  enum class Kind { Wait, Go, Restart, Failed, Finished };
  Kind kind = Kind::Wait;
  Assignment assignment;  // Go
  std::string why;        // Restart, Failed
};

class ElasticRounds {
 public:
  using Clock = std::chrono::steady_clock;

  ElasticRounds(ElasticConfig config, Clock::time_point now);

  /// A launcher connected; its id.
  int connect(Clock::time_point now);
  /// Its connection closed (or it went silent): a member of the running round is lost.
  void disconnect(int node);
  /// Any request from `node`: it is alive.
  void seen(int node, Clock::time_point now);
  /// `node` wants a place in the next round: at start, when told to restart, or after its workers
  /// failed (`failure` says how; empty otherwise). Returns whether this counted as one of the
  /// job's restarts (a failure that began a round change; one inside a change already ordered,
  /// a node lost or joining, does not count).
  bool join(int node, const NodeOffer& offer, const std::string& failure, Clock::time_point now);
  PollAnswer poll(int node, Clock::time_point now);
  /// `node`'s workers all succeeded.
  void done(int node);
  /// Whether every node of the last round is done or gone, and one at least is done.
  bool finished() const;
  /// Launchers connected now (the serving node stops serving once it is the only one left).
  int connected() const { return static_cast<int>(connected_.size()); }
  /// Silent nodes to drop (the server closes their connections).
  std::vector<int> expired(Clock::time_point now) const;
  int round() const { return round_; }

 private:
  struct Joined {
    int node;
    NodeOffer offer;
  };
  bool in(const std::vector<Joined>& list, int node) const;
  void maybe_close(Clock::time_point now);
  // A node waits and the running round has fewer than MAX: a restart would take it in.
  bool room_for_waiting() const;
  Assignment assignment_of(int node) const;

  ElasticConfig config_;
  int next_id_ = 0;
  int round_ = 0;
  bool closed_ = false;
  bool lost_ = false;            // the closed round lost a node
  std::string failed_;           // the job's rendezvous failed: why
  std::vector<Joined> joining_;  // the open round, in order of joining
  std::vector<Joined> members_;  // the closed round, node 0 first
  std::vector<Joined> waiting_;  // nodes that asked to join a closed round
  std::set<int> previous_;       // the round before the open one
  std::set<int> connected_, done_;
  int restarts_ = 0;
  std::map<int, Clock::time_point> last_seen_;
  Clock::time_point opened_at_, last_join_;
};

}  // namespace tandem::launch
