// Note [Elastic rounds], rule by rule, on a clock the test moves: when a round closes, who is in
// it and where, what its nodes are told when a node is lost, comes back or fails.
#include <gtest/gtest.h>

#include "launch/elastic_protocol.h"
#include "launch/elastic_rounds.h"
#include "tandem/error.h"

using namespace tandem::launch;
using namespace std::chrono_literals;
using Kind = PollAnswer::Kind;

namespace {

struct Rounds {
  ElasticRounds::Clock::time_point t{};
  ElasticRounds r;
  explicit Rounds(int min, int max, int max_restarts = 3)
      : r(ElasticConfig{min, max, std::chrono::milliseconds(2000), std::chrono::milliseconds(60000),
                        std::chrono::milliseconds(15000), max_restarts},
          ElasticRounds::Clock::time_point{}) {}
  void pass(std::chrono::milliseconds d) { t += d; }
  int node() { return r.connect(t); }
  bool join(int n, int nproc = 2, bool host = false, const std::string& failure = "") {
    return r.join(n, NodeOffer{nproc, "10.0.0." + std::to_string(n + 1), 20000 + n, host}, failure, t);
  }
  bool fail(int n, bool host = false) { return join(n, 2, host, "rank 0 failed with exit code 3"); }
  /// A serving node and another, both in a running round 0 (MIN 1, MAX 2): {host, other}.
  std::pair<int, int> running_pair() {
    const int host = node(), other = node();
    join(host, 2, true);
    join(other);
    EXPECT_EQ(poll(host).kind, Kind::Go);
    return {host, other};
  }
  PollAnswer poll(int n) { return r.poll(n, t); }
};

}  // namespace

TEST(ElasticRounds, ClosesAtMaxAtOnceAndAtMinAfterTheLastCall) {
  Rounds x(1, 2);
  const int a = x.node(), b = x.node();
  x.join(a);
  EXPECT_EQ(x.poll(a).kind, Kind::Wait);
  x.pass(1999ms);
  EXPECT_EQ(x.poll(a).kind, Kind::Wait);  // MIN is in, but the last call is not over
  x.join(b);                               // MAX: closes at once
  const auto go = x.poll(b);
  ASSERT_EQ(go.kind, Kind::Go);
  EXPECT_EQ(go.assignment.round, 0);
  EXPECT_EQ(go.assignment.node_rank, 1);
  EXPECT_EQ(go.assignment.world_size, 4);
  EXPECT_EQ(go.assignment.rank_offset, 2);
  EXPECT_EQ(go.assignment.master_addr, "10.0.0.1");  // node 0's offer
  EXPECT_EQ(go.assignment.master_port, 20000);

  Rounds y(1, 3);
  const int c = y.node();
  y.join(c);
  y.pass(2000ms);
  const auto alone = y.poll(c);
  ASSERT_EQ(alone.kind, Kind::Go);
  EXPECT_EQ(alone.assignment.nnodes, 1);
  EXPECT_EQ(alone.assignment.world_size, 2);
}

TEST(ElasticRounds, ALateJoinRestartsTheLastCallAndTheHostIsNodeZero) {
  Rounds x(1, 3);
  const int a = x.node(), b = x.node();
  x.join(a, 1);
  x.pass(1500ms);
  x.join(b, 3, /*host=*/true);
  x.pass(1500ms);
  EXPECT_EQ(x.poll(a).kind, Kind::Wait);  // 1.5 s since the last join
  x.pass(500ms);
  const auto ga = x.poll(a), gb = x.poll(b);
  ASSERT_EQ(ga.kind, Kind::Go);
  EXPECT_EQ(gb.assignment.node_rank, 0);  // the host first, though it joined second
  EXPECT_EQ(ga.assignment.node_rank, 1);
  EXPECT_EQ(ga.assignment.rank_offset, 3);
  EXPECT_EQ(ga.assignment.world_size, 4);
  EXPECT_EQ(ga.assignment.master_addr, "10.0.0.2");
}

TEST(ElasticRounds, FewerThanMinFailAtTheJoinTimeout) {
  Rounds x(2, 2);
  const int a = x.node();
  x.join(a);
  x.pass(59s);
  EXPECT_EQ(x.poll(a).kind, Kind::Wait);
  x.pass(1s);
  const auto failed = x.poll(a);
  ASSERT_EQ(failed.kind, Kind::Failed);
  EXPECT_EQ(failed.why, "only 1 of the 2 node(s) --nnodes asks for joined round 0 within 60 s (join_timeout)");
}

TEST(ElasticRounds, ALostNodeRestartsTheOthersWhoGoOnWithoutIt) {
  Rounds x(1, 2);
  const auto [a, b] = x.running_pair();
  x.r.disconnect(b);
  const auto told = x.poll(a);
  ASSERT_EQ(told.kind, Kind::Restart);
  EXPECT_EQ(told.why, "a node of round 0 was lost");
  EXPECT_FALSE(x.fail(a, true));  // its workers failing with the lost node do not count as a restart
  EXPECT_EQ(x.r.round(), 1);
  x.pass(2000ms);  // the lost node does not hold the round up
  const auto go = x.poll(a);
  ASSERT_EQ(go.kind, Kind::Go);
  EXPECT_EQ(go.assignment.round, 1);
  EXPECT_EQ(go.assignment.world_size, 2);
}

TEST(ElasticRounds, AFailureOpensTheNextRoundAndWaitsForTheOtherNodes) {
  Rounds x(1, 3);
  const int a = x.node(), b = x.node(), c = x.node();
  x.join(a);
  x.join(b);
  x.join(c);
  ASSERT_EQ(x.poll(a).kind, Kind::Go);
  EXPECT_TRUE(x.fail(b));  // b's workers failed first: one restart of the job
  const auto told = x.poll(a);
  ASSERT_EQ(told.kind, Kind::Restart);
  EXPECT_EQ(told.why, "round 1 began without this node (another node's workers failed)");
  EXPECT_FALSE(x.fail(a));  // a's workers failed with b's: the same restart
  x.pass(10s);
  EXPECT_EQ(x.poll(a).kind, Kind::Wait);  // c is still there, stopping its workers: wait for it
  x.join(c);
  x.pass(2000ms);
  const auto go = x.poll(c);
  ASSERT_EQ(go.kind, Kind::Go);
  EXPECT_EQ(go.assignment.nnodes, 3);
}

TEST(ElasticRounds, ANodeThatComesBackJoinsAtTheNextRound) {
  Rounds x(1, 2);
  const int a = x.node();
  x.join(a);
  x.pass(2000ms);
  ASSERT_EQ(x.poll(a).kind, Kind::Go);
  const int b = x.node();
  EXPECT_FALSE(x.join(b));
  EXPECT_EQ(x.poll(b).kind, Kind::Wait);
  const auto told = x.poll(a);
  ASSERT_EQ(told.kind, Kind::Restart);
  EXPECT_EQ(told.why, "a node asks to join round 1");
  EXPECT_FALSE(x.join(a));  // ordered, not a failure
  const auto go = x.poll(b);  // both in: MAX, at once
  ASSERT_EQ(go.kind, Kind::Go);
  EXPECT_EQ(go.assignment.round, 1);
  EXPECT_EQ(go.assignment.world_size, 4);
}

TEST(ElasticRounds, MoreThanMaxWaitAndTheJobFinishesWithoutThem) {
  Rounds x(1, 1);
  const int a = x.node(), b = x.node();
  x.join(a);
  x.join(b);
  ASSERT_EQ(x.poll(a).kind, Kind::Go);
  EXPECT_EQ(x.poll(b).kind, Kind::Wait);
  EXPECT_FALSE(x.r.finished());
  x.r.done(a);
  EXPECT_TRUE(x.r.finished());
  EXPECT_EQ(x.poll(b).kind, Kind::Finished);
}

TEST(ElasticRounds, ASilentNodeExpires) {
  Rounds x(1, 2);
  const int a = x.node(), b = x.node();
  x.pass(10s);
  x.r.seen(a, x.t);
  x.pass(5s);
  EXPECT_EQ(x.r.expired(x.t), std::vector<int>{b});
}

TEST(ElasticProtocol, AnswersRoundTrip) {
  PollAnswer go;
  go.kind = Kind::Go;
  go.assignment = Assignment{3, 1, 2, 4, 2, "10.1.2.3", 29500};
  const auto line = encode_fields(encode_answer(go));
  EXPECT_EQ(line, "GO\t3\t1\t2\t4\t2\t10.1.2.3\t29500\n");
  const auto back = decode_answer(split_fields(line.substr(0, line.size() - 1)));
  EXPECT_EQ(back.assignment.master_addr, "10.1.2.3");
  EXPECT_EQ(back.assignment.rank_offset, 2);
  EXPECT_THROW(encode_fields({"a\tb"}), tandem::Error);
  EXPECT_THROW(decode_answer({"GO", "1"}), tandem::Error);
  EXPECT_THROW(decode_answer({"GO", "x", "1", "2", "4", "2", "h", "1"}), tandem::Error);
}

TEST(ElasticRounds, RestartsAreCountedForTheJob) {
  Rounds x(1, 2, /*max_restarts=*/1);
  const auto [a, b] = x.running_pair();
  EXPECT_TRUE(x.fail(b));
  EXPECT_FALSE(x.fail(a));
  ASSERT_EQ(x.poll(b).kind, Kind::Go);  // round 1, both
  EXPECT_TRUE(x.fail(a, true));         // the second failure, wherever it is, is one too many
  const auto failed = x.poll(b);
  ASSERT_EQ(failed.kind, Kind::Failed);
  EXPECT_EQ(failed.why, "after 1 restart(s) (--max-restarts): rank 0 failed with exit code 3");
  EXPECT_EQ(x.poll(a).kind, Kind::Failed);
}

TEST(ElasticRounds, AFailureAfterAnotherNodeFinishedFailsTheJob) {
  Rounds x(1, 2);
  const auto [a, b] = x.running_pair();
  x.r.done(a);
  x.fail(b);
  const auto failed = x.poll(b);
  ASSERT_EQ(failed.kind, Kind::Failed);
  EXPECT_EQ(failed.why, "a node's workers failed after another node's had finished: rank 0 failed with exit code 3");
}

TEST(ElasticRounds, TheLastRoundsNodesComeBeforeNewcomersEvenAtMax) {
  Rounds x(1, 2);
  const auto [host, b] = x.running_pair();
  const int d = x.node();
  x.join(d);                // waits: the round is full
  EXPECT_EQ(x.poll(d).kind, Kind::Wait);
  EXPECT_TRUE(x.fail(b));   // round 1 opens with b and the waiting d: MAX, but the host is still stopping
  EXPECT_EQ(x.poll(d).kind, Kind::Wait);
  EXPECT_EQ(x.poll(host).kind, Kind::Restart);
  x.join(host, 2, true);
  const auto go_host = x.poll(host), go_b = x.poll(b), go_d = x.poll(d);
  ASSERT_EQ(go_host.kind, Kind::Go);
  EXPECT_EQ(go_host.assignment.node_rank, 0);
  ASSERT_EQ(go_b.kind, Kind::Go);
  EXPECT_EQ(go_b.assignment.node_rank, 1);
  EXPECT_EQ(go_d.kind, Kind::Wait);  // the newcomer waits for the next place
}

TEST(ElasticRounds, AFinishedNodeDoesNotHoldTheNextRoundUp) {
  Rounds x(1, 2);
  const auto [a, b] = x.running_pair();
  x.r.disconnect(b);  // lost
  x.r.done(a);
  EXPECT_TRUE(x.r.finished());
  EXPECT_EQ(x.r.connected(), 1);
}
