#include "launch/elastic_rounds.h"

#include <algorithm>

namespace tandem::launch {

ElasticRounds::ElasticRounds(ElasticConfig config, Clock::time_point now)
    : config_(config), opened_at_(now), last_join_(now) {}

bool ElasticRounds::in(const std::vector<Joined>& list, int node) const {
  return std::any_of(list.begin(), list.end(), [&](const Joined& j) { return j.node == node; });
}

int ElasticRounds::connect(Clock::time_point now) {
  const int id = next_id_++;
  connected_.insert(id);
  last_seen_[id] = now;
  return id;
}

void ElasticRounds::disconnect(int node) {
  connected_.erase(node);
  last_seen_.erase(node);
  auto drop = [&](std::vector<Joined>& list) {
    list.erase(std::remove_if(list.begin(), list.end(), [&](const Joined& j) { return j.node == node; }), list.end());
  };
  drop(joining_);
  drop(waiting_);
  if (closed_ && in(members_, node) && !done_.count(node)) lost_ = true;
}

void ElasticRounds::seen(int node, Clock::time_point now) {
  if (connected_.count(node)) last_seen_[node] = now;
}

bool ElasticRounds::join(int node, const NodeOffer& offer, const std::string& failure, Clock::time_point now) {
  if (!failed_.empty()) return false;
  auto place = [&](std::vector<Joined>& list) {
    for (auto& j : list) {
      if (j.node == node) return void(j.offer = offer);
    }
    list.push_back({node, offer});
  };
  if (!closed_) {
    if (!in(joining_, node)) last_join_ = now;
    place(joining_);
    return false;
  }
  if (!in(members_, node)) {  // a new node, or one back: it waits for the next restart
    place(waiting_);
    return false;
  }
  // A member of the running round asks again: the next round opens with it and the waiting nodes.
  if (!done_.empty() && !failure.empty()) {
    failed_ = "a node's workers failed after another node's had finished: " + failure;
    return false;
  }
  const bool counted = !failure.empty() && !lost_ && !room_for_waiting();
  if (counted && ++restarts_ > config_.max_restarts) {
    failed_ = (config_.max_restarts ? "after " + std::to_string(config_.max_restarts) + " restart(s) (--max-restarts): "
                                    : std::string()) + failure;
    return true;
  }
  ++round_;
  closed_ = false;
  lost_ = false;
  previous_.clear();
  for (const auto& m : members_) {
    if (!done_.count(m.node)) previous_.insert(m.node);
  }
  joining_.clear();
  joining_.push_back({node, offer});
  joining_.insert(joining_.end(), waiting_.begin(), waiting_.end());
  waiting_.clear();
  members_.clear();
  done_.clear();
  opened_at_ = last_join_ = now;
  return counted;
}

void ElasticRounds::maybe_close(Clock::time_point now) {
  if (closed_ || !failed_.empty()) return;
  const int n = static_cast<int>(joining_.size());
  const bool timed_out = now - opened_at_ >= config_.join_timeout;
  // The last round's nodes that are still there (stopping their workers) are waited for, up to
  // the join timeout, even when MAX nodes are in: they come before newcomers.
  bool blocked = false;
  for (int p : previous_) blocked = blocked || (connected_.count(p) && !in(joining_, p));
  const bool enough = n >= config_.max_nodes || (n >= config_.min_nodes && now - last_join_ >= config_.last_call);
  const bool ready = enough && (!blocked || timed_out);
  if (!ready) {
    if (n < config_.min_nodes && timed_out) {
      failed_ = "only " + std::to_string(n) + " of the " + std::to_string(config_.min_nodes) +
                " node(s) --nnodes asks for joined round " + std::to_string(round_) + " within " +
                std::to_string(config_.join_timeout.count() / 1000) + " s (join_timeout)";
    }
    return;
  }
  members_ = joining_;
  auto order = [&](const Joined& j) { return j.offer.hosts_server ? 0 : previous_.count(j.node) ? 1 : 2; };
  std::stable_sort(members_.begin(), members_.end(), [&](const Joined& a, const Joined& b) { return order(a) < order(b); });
  if (static_cast<int>(members_.size()) > config_.max_nodes) {
    // More joined than fit: the last ones wait for the next round.
    waiting_.insert(waiting_.begin(), members_.begin() + config_.max_nodes, members_.end());
    members_.resize(static_cast<size_t>(config_.max_nodes));
  }
  joining_.clear();
  previous_.clear();
  done_.clear();
  closed_ = true;
  lost_ = false;
}

Assignment ElasticRounds::assignment_of(int node) const {
  Assignment a;
  a.round = round_;
  a.nnodes = static_cast<int>(members_.size());
  a.master_addr = members_.front().offer.addr;
  a.master_port = members_.front().offer.port;
  int offset = 0;
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i].node == node) {
      a.node_rank = static_cast<int>(i);
      a.rank_offset = offset;
    }
    offset += members_[i].offer.nproc;
  }
  a.world_size = offset;
  return a;
}

PollAnswer ElasticRounds::poll(int node, Clock::time_point now) {
  maybe_close(now);
  PollAnswer answer;
  if (!failed_.empty()) {
    answer.kind = PollAnswer::Kind::Failed;
    answer.why = failed_;
    return answer;
  }
  if (closed_ && in(members_, node)) {
    if (lost_ || room_for_waiting()) {
      answer.kind = PollAnswer::Kind::Restart;
      answer.why = lost_ ? "a node of round " + std::to_string(round_) + " was lost"
                         : "a node asks to join round " + std::to_string(round_ + 1);
      return answer;
    }
    answer.kind = PollAnswer::Kind::Go;
    answer.assignment = assignment_of(node);
    return answer;
  }
  if (in(waiting_, node) && finished()) {
    answer.kind = PollAnswer::Kind::Finished;
    return answer;
  }
  if (in(joining_, node) || in(waiting_, node)) return answer;  // Wait
  answer.kind = PollAnswer::Kind::Restart;
  answer.why = "round " + std::to_string(round_) + " began without this node (another node's workers failed)";
  return answer;
}

bool ElasticRounds::room_for_waiting() const {
  return !waiting_.empty() && static_cast<int>(members_.size()) < config_.max_nodes;
}

void ElasticRounds::done(int node) { done_.insert(node); }

bool ElasticRounds::finished() const {
  if (!closed_ || members_.empty()) return false;
  bool any_done = false;
  for (const auto& m : members_) {
    if (done_.count(m.node)) {
      any_done = true;
    } else if (connected_.count(m.node)) {
      return false;
    }
  }
  return any_done;
}

std::vector<int> ElasticRounds::expired(Clock::time_point now) const {
  std::vector<int> out;
  for (const auto& [node, when] : last_seen_) {
    if (now - when >= config_.keep_alive) out.push_back(node);
  }
  return out;
}

}  // namespace tandem::launch
