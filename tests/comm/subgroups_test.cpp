// Subgroups, the device mesh and point-to-point, on real engines, checked exactly against closed
// forms. Like collectives_test, one binary runs as a world of one and as every rank of a
// `tandem run` job (Gloo and MPI, 2 and 4 ranks): each rank runs the same tests in the same order.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <thread>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "support/distributed_main.h"
#include "support/errors.h"
#include "tandem/comm/device_mesh.h"
#include "tandem/comm/process_group.h"
#include "tandem/error.h"

using tandem::comm::DeviceMesh;
using tandem::comm::P2POp;
using tandem::comm::ProcessGroup;
using tandem::comm::ReduceOp;

namespace {

using tandem::test::pg;
using tandem::test::shared_pg;
int W() { return pg().size(); }
int R() { return pg().rank(); }

// The sum of the global ranks in `ranks`, as every member of their group must find by all_reduce.
int64_t sum_of(const std::vector<int>& ranks) { return std::accumulate(ranks.begin(), ranks.end(), int64_t{0}); }

int64_t all_reduced_rank_sum(ProcessGroup& group) {
  at::Tensor t = at::full({3}, group.world().rank, at::kLong);
  group.all_reduce(t, ReduceOp::Sum);
  EXPECT_TRUE(at::equal(t, at::full({3}, t[0].item<int64_t>(), at::kLong)));
  return t[0].item<int64_t>();
}

// Every rank's value of `mine` over the world group.
std::vector<int64_t> everyones(int64_t mine) {
  std::vector<int64_t> out;
  for (const auto& t : pg().all_gather(at::full({1}, mine, at::kLong))) out.push_back(t.item<int64_t>());
  return out;
}

}  // namespace

TEST(Subgroups, SplitByParityTranslatesRanksAndReducesWithinTheGroup) {
  auto group = pg().split(R() % 2, "parity");
  ASSERT_TRUE(group);
  std::vector<int> members;
  for (int r = R() % 2; r < W(); r += 2) members.push_back(r);
  EXPECT_EQ(group->size(), static_cast<int>(members.size()));
  EXPECT_EQ(group->rank(), R() / 2);
  EXPECT_EQ(group->global_ranks(), members);
  EXPECT_EQ(group->name(), "parity");
  for (int g = 0; g < group->size(); ++g) {
    EXPECT_EQ(group->global_rank(g), members[static_cast<size_t>(g)]);
    EXPECT_EQ(group->group_rank(members[static_cast<size_t>(g)]), g);
  }
  EXPECT_EQ(group->global_rank(group->size()), -1);
  for (int g = 0; g < W(); ++g) EXPECT_EQ(group->group_rank(g), g % 2 == R() % 2 ? g / 2 : -1) << g;
  // Its own numbering: the subgroup's first collective is #1 whatever the world group did.
  EXPECT_EQ(group->last_sequence_number(), 0u);
  EXPECT_EQ(all_reduced_rank_sum(*group), sum_of(members));
  EXPECT_EQ(group->last_sequence_number(), 1u);
  // Its other collectives too.
  at::Tensor b = at::full({2}, R(), at::kFloat);
  group->broadcast(b, group->size() - 1);
  EXPECT_TRUE(at::equal(b, at::full({2}, members.back(), at::kFloat)));
  auto gathered = group->all_gather(at::full({1}, R(), at::kInt));
  for (size_t g = 0; g < gathered.size(); ++g) EXPECT_EQ(gathered[g].item<int>(), members[g]);
  group->barrier();
}

// traffic(): each collective counted once, with the bytes of its whole buffer, and the host time
// of its waits; a group's own, untouched by the world group's calls.
TEST(Subgroups, TrafficCountsEachCollectiveAndItsWholeBuffer) {
  auto group = pg().split(0, "traffic");
  ASSERT_TRUE(group);
  const int64_t n = group->size();
  EXPECT_EQ(group->traffic().collectives, 0u);
  EXPECT_EQ(group->traffic().bytes, 0);
  at::Tensor sum = at::ones({5}, at::kFloat);  // 20 bytes
  group->all_reduce(sum);
  at::Tensor part = at::ones({3}, at::kDouble), whole = at::empty({3 * n}, at::kDouble);  // 24 n bytes
  group->all_gather_into(whole, part);
  at::Tensor input = at::ones({2 * n}, at::kFloat), slice = at::empty({2}, at::kFloat);  // 8 n bytes
  group->reduce_scatter(slice, input);
  (void)group->all_gather(at::ones({1}, at::kLong));  // 8 n bytes
  group->barrier();  // no buffer
  at::Tensor world_sum = at::ones({1000}, at::kFloat);
  pg().all_reduce(world_sum);  // the world group's, not this one's
  const auto traffic = group->traffic();
  EXPECT_EQ(traffic.collectives, 5u);
  EXPECT_EQ(traffic.bytes, 20 + 24 * n + 8 * n + 8 * n);
  EXPECT_GE(traffic.wait_s, 0.0);
  EXPECT_EQ(traffic.collectives, group->last_sequence_number());
}

TEST(Subgroups, NegativeColorJoinsNoGroup) {
  auto group = pg().split(R() == 0 ? -1 : 7, "not_zero");
  if (R() == 0) {
    EXPECT_FALSE(group);
    return;
  }
  ASSERT_TRUE(group);
  EXPECT_EQ(group->size(), W() - 1);
  EXPECT_EQ(group->rank(), R() - 1);
  std::vector<int> members(static_cast<size_t>(W() - 1));
  std::iota(members.begin(), members.end(), 1);
  EXPECT_EQ(all_reduced_rank_sum(*group), sum_of(members));
}

TEST(Subgroups, NewGroupSortsItsRanksAndLeavesOthersOut) {
  const std::vector<int> ranks = W() > 1 ? std::vector<int>{W() - 1, 0} : std::vector<int>{0};
  auto group = pg().new_group(ranks, "ends");
  const bool member = R() == 0 || R() == W() - 1;
  ASSERT_EQ(static_cast<bool>(group), member);
  if (!group) return;
  EXPECT_EQ(group->global_rank(0), 0);  // sorted, as PyTorch's new_group does
  EXPECT_EQ(group->rank(), R() == 0 ? 0 : 1);
  EXPECT_EQ(all_reduced_rank_sum(*group), W() > 1 ? W() - 1 : 0);
}

TEST(Subgroups, NestedSubgroupsKeepGlobalRanks) {
  auto half = pg().split(R() < (W() + 1) / 2 ? 0 : 1, "half");
  auto single = half->split(half->rank(), "single");  // a group of one inside each half
  ASSERT_TRUE(single);
  EXPECT_EQ(single->size(), 1);
  EXPECT_EQ(single->global_rank(0), R());
  EXPECT_EQ(all_reduced_rank_sum(*single), R());
  EXPECT_EQ(single->describe_rank(0), "rank 0 of group 'single' (global rank " + std::to_string(R()) + ")");
}

TEST(Subgroups, StoreKeysAreScopedPerGroup) {
  // Two groups write the same key: each reads back its own value, never the other's.
  auto group = pg().split(R() % 2, "scoped");
  const std::string mine = "group of rank " + std::to_string(group->global_rank(0));
  if (group->rank() == 0) group->store()->set("same_key", std::vector<uint8_t>(mine.begin(), mine.end()));
  group->barrier();
  const auto got = group->store()->get("same_key");
  EXPECT_EQ(std::string(got.begin(), got.end()), mine);
  // The world group's store never saw the key under that name.
  EXPECT_FALSE(pg().store()->check({"same_key"}));
  pg().barrier();
}

TEST(Subgroups, EveryRankMustPassTheSameRanks) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  const std::vector<int> ranks = R() == 0 ? std::vector<int>{0} : std::vector<int>{0, 1};
  EXPECT_ERROR_HAS(pg().new_group(ranks, "bad"), "new_group 'bad': rank 1 passed other ranks than rank 0 (rank " +
                                                      std::to_string(R()) + " passed [");
  // Nothing was made: the next group is made by every rank alike.
  auto group = pg().new_group({0, 1});
  EXPECT_EQ(static_cast<bool>(group), R() < 2);
}

// Agreement before waiting: ranks that make their subgroups in another order stop at once, every
// one of them, naming the groups and the ranks (instead of pairing one group's calls with another's).
TEST(Subgroups, SubgroupsMadeInAnotherOrderAreOneLineOnEveryRank) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  std::string others = W() == 2 ? "rank 1" : "ranks 1";
  for (int r = 2; r < W(); ++r) others += ", " + std::to_string(r);
  EXPECT_ERROR(pg().split(0, R() == 0 ? "tp" : "dp"),
               "split: the ranks of the world group disagree on the name of the group being made: tp on rank 0; dp on " +
                   others);
  auto fine = pg().split(0, "dp");  // and they go on together
  EXPECT_EQ(fine->size(), W());
}

TEST(Subgroups, BadRankListsAreOneLineErrors) {
  EXPECT_ERROR(pg().new_group({}), "new_group: the list of ranks is empty");
  EXPECT_ERROR(pg().new_group({0, 0}), "new_group: rank 0 appears twice in [0, 0]");
  EXPECT_ERROR(pg().new_group({0, W()}), "new_group: [0, " + std::to_string(W()) + "] names rank " +
                                             std::to_string(W()) + ", but the group has ranks 0 to " +
                                             std::to_string(W() - 1));
}

TEST(Subgroups, AGroupDroppedAtOnceNeverFailsASlowerMember) {
  // Note [Connected before returned]: a member that finished connecting first and dropped the
  // group at once used to close sockets a slower member was still being handed, whose creation
  // then failed with "Connection closed by peer" (once in CI). Many groups in a row, each dropped
  // as soon as it is made: a race, so this loop makes it likely rather than certain.
  for (int i = 0; i < 40; ++i) {
    auto group = pg().split(0, "dropped");
    ASSERT_TRUE(group);
    EXPECT_EQ(group->size(), W());
  }
  EXPECT_EQ(all_reduced_rank_sum(*pg().split(0, "after")), int64_t{W()} * (W() - 1) / 2);
}

TEST(DeviceMesh, RowMajorGroupsAlongEachDimension) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, W()}, std::vector<int64_t>{W(), 1},
                                            W() % 2 == 0 ? std::vector<int64_t>{2, W() / 2} : std::vector<int64_t>{W(), 1}}) {
    DeviceMesh mesh(shared_pg(), shape, {"dp", "tp"});
    const int64_t tp = shape[1];
    const std::vector<int64_t> coordinate{R() / tp, R() % tp};
    EXPECT_EQ(mesh.coordinate(), coordinate);
    EXPECT_EQ(mesh.size(), W());
    EXPECT_EQ(mesh.size("tp"), tp);
    EXPECT_EQ(mesh.local_rank("dp"), coordinate[0]);
    std::vector<int> tp_ranks, dp_ranks;
    for (int64_t c = 0; c < tp; ++c) tp_ranks.push_back(static_cast<int>(coordinate[0] * tp + c));
    for (int64_t d = 0; d < shape[0]; ++d) dp_ranks.push_back(static_cast<int>(d * tp + coordinate[1]));
    EXPECT_EQ(mesh["tp"].ranks(), tp_ranks);
    EXPECT_EQ(mesh["dp"].ranks(), dp_ranks);
    EXPECT_EQ(mesh["tp"].group()->global_ranks(), tp_ranks);
    EXPECT_EQ(mesh["dp"].group()->global_ranks(), dp_ranks);
    EXPECT_EQ(all_reduced_rank_sum(*mesh.group("tp")), sum_of(tp_ranks));
    EXPECT_EQ(all_reduced_rank_sum(*mesh.group("dp")), sum_of(dp_ranks));
    std::vector<int> all(static_cast<size_t>(W()));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(mesh.ranks(), all);
    EXPECT_EQ(mesh[(std::vector<std::string>{"dp", "tp"})].ranks(), all);
    // Flattened: every rank again, in row-major order.
    auto flat = mesh.flatten({"dp", "tp"}, "dp_tp");
    EXPECT_EQ(flat.group()->global_ranks(), all);
    EXPECT_EQ(mesh["dp_tp"].size(), W());
    EXPECT_EQ(flat.group()->rank(), R());
  }
}

TEST(DeviceMesh, ThreeDimensionsAndAFlattenOfTwo) {
  if (W() != 4) GTEST_SKIP() << "laid out for 4 ranks";
  DeviceMesh mesh(shared_pg(), {2, 1, 2}, {"replicate", "shard", "tp"});
  auto dp = mesh.flatten({"replicate", "shard"}, "dp");
  const std::vector<int> expected = {R() % 2, R() % 2 + 2};
  EXPECT_EQ(dp.group()->global_ranks(), expected);
  EXPECT_EQ(mesh[(std::vector<std::string>{"dp", "tp"})].shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(mesh.describe(), "DeviceMesh(replicate=2, shard=1, tp=2) at coordinate (" + std::to_string(R() / 2) +
                                 ", 0, " + std::to_string(R() % 2) + ")");
}

TEST(DeviceMesh, BadShapesAreOneLineErrors) {
  const std::string w = std::to_string(W());
  EXPECT_ERROR(DeviceMesh(shared_pg(), {}, {}), "DeviceMesh: the shape is empty; give one size per dimension, e.g. {2, 2}");
  EXPECT_ERROR(DeviceMesh(shared_pg(), {W() + 1}, {"dp"}),
               "DeviceMesh: shape [" + std::to_string(W() + 1) + "] holds " + std::to_string(W() + 1) +
                   " processes, but the process group has " + w + ": the sizes must multiply to the world size");
  EXPECT_ERROR(DeviceMesh(shared_pg(), {W(), 0}, {"dp", "tp"}),
               "DeviceMesh: dimension 'tp' has size 0; every size must be at least 1");
  EXPECT_ERROR(DeviceMesh(shared_pg(), {W(), 1}, {"dp"}),
               "DeviceMesh: shape [" + w + ", 1] has 2 dimension(s) but 1 name(s) were given (dp)");
  EXPECT_ERROR(DeviceMesh(shared_pg(), {W(), 1}, {"dp", "dp"}), "DeviceMesh: the name 'dp' is given twice (dp, dp)");
  EXPECT_ERROR(DeviceMesh(shared_pg(), {W(), 1}, {"dp", ""}), "DeviceMesh: dimension 1 has an empty name");
  DeviceMesh mesh(shared_pg(), {W(), 1}, {"dp", "tp"});
  EXPECT_ERROR(mesh["pp"], "DeviceMesh has no dimension 'pp' (its dimensions: dp, tp)");
  EXPECT_ERROR((mesh[std::vector<std::string>{"tp", "dp"}]),
               "DeviceMesh: the sub-mesh (tp, dp) must list its dimensions in the mesh's order (dp, tp)");
  EXPECT_ERROR(mesh.group(), "DeviceMesh::group(): the mesh has 2 dimensions; name one (dp, tp)");
  EXPECT_ERROR(mesh.flatten({"dp", "tp"}, "tp"), "DeviceMesh::flatten: 'tp' already names a dimension (dp, tp)");
  // A sub-mesh has only its own dimensions (PyTorch: mesh["dp"]["tp"] is an error too).
  EXPECT_ERROR(mesh["dp"]["tp"], "DeviceMesh (a sub-mesh) has no dimension 'tp' (its dimensions: dp)");
  EXPECT_ERROR(mesh["dp"].size("tp"), "DeviceMesh (a sub-mesh) has no dimension 'tp' (its dimensions: dp)");
}

// Agreement before waiting: ranks that build different meshes stop at once, every one of them,
// with the shapes and the ranks named (not a hang in a group only some of them made).
TEST(DeviceMesh, ShapesThatDifferBetweenRanksAreOneLineOnEveryRank) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  std::string others = W() == 2 ? "rank 1" : "ranks 1";
  for (int r = 2; r < W(); ++r) others += ", " + std::to_string(r);
  const std::string w = std::to_string(W());
  EXPECT_ERROR(DeviceMesh(shared_pg(), R() == 0 ? std::vector<int64_t>{W(), 1} : std::vector<int64_t>{1, W()},
                          {"dp", "tp"}),
               "DeviceMesh: the ranks of the world group disagree on shape: [" + w + ", 1] on rank 0; [1, " + w +
                   "] on " + others);
  EXPECT_ERROR(DeviceMesh(shared_pg(), {W(), 1}, R() == 0 ? std::vector<std::string>{"dp", "tp"}
                                                          : std::vector<std::string>{"tp", "dp"}),
               "DeviceMesh: the ranks of the world group disagree on dimension names: dp, tp on rank 0; tp, dp on " +
                   others);
  DeviceMesh fine(shared_pg(), {W(), 1}, {"dp", "tp"});  // and they go on together
  EXPECT_EQ(fine.size("dp"), W());
}

TEST(PointToPoint, RingExchangeInOneBatch) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {  // the last past MPI's eager limit
    at::Tensor out = at::arange(n, at::kFloat) + 1000 * R();
    at::Tensor in = at::empty({n}, at::kFloat);
    std::vector<P2POp> ops{P2POp::send(out, (R() + 1) % W()), P2POp::recv(in, (R() + W() - 1) % W())};
    for (auto& work : pg().batch_isend_irecv(ops)) work->wait();
    EXPECT_TRUE(at::equal(in, at::arange(n, at::kFloat) + 1000 * ((R() + W() - 1) % W()))) << n;
  }
}

TEST(PointToPoint, MessagesBetweenTwoRanksArriveInOrder) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  constexpr int kMessages = 20;
  if (R() == 0) {
    for (int i = 0; i < kMessages; ++i) pg().send(at::full({i + 1}, i, at::kDouble), 1);
  } else if (R() == 1) {
    for (int i = 0; i < kMessages; ++i) {
      at::Tensor t = at::empty({i + 1}, at::kDouble);
      pg().recv(t, 0);
      EXPECT_TRUE(at::equal(t, at::full({i + 1}, i, at::kDouble))) << i;
    }
  }
}

// Tags are separate streams between the same two ranks: rank 1 receives tag 7's messages before
// tag 3's though rank 0 sent them after (a pipeline's activations and gradients, whose orders
// differ by stage). With one stream, the first receive would take tag 3's first message (of
// another size: an error) or hang.
TEST(PointToPoint, TagsAreSeparateStreams) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  constexpr int kEach = 5;
  if (R() == 0) {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<at::Tensor> kept;
    for (int tag : {3, 7}) {
      for (int i = 0; i < kEach; ++i) {
        kept.push_back(at::full({tag + i}, 100 * tag + i, at::kFloat));
        works.push_back(pg().isend(kept.back(), 1, tag));
      }
    }
    for (auto& w : works) w->wait();
  } else if (R() == 1) {
    for (int tag : {7, 3}) {
      for (int i = 0; i < kEach; ++i) {
        at::Tensor t = at::empty({tag + i}, at::kFloat);
        pg().recv(t, 0, tag);
        EXPECT_TRUE(at::equal(t, at::full({tag + i}, 100 * tag + i, at::kFloat))) << "tag " << tag << ", message " << i;
      }
    }
  }
  EXPECT_ERROR(pg().send(at::ones({1}), (R() + 1) % W(), -1), "send with tag -1: tags are 0 or more");
}

// Note [Point-to-point and the collective sequence]: under load, p2p on some ranks and subgroups
// mixed with collectives on the world and on subgroups; every rank ends at the same collective
// numbers, and every value is the closed form.
TEST(PointToPoint, MixedWithCollectivesOnSubgroupsUnderLoad) {
  if (W() < 2) GTEST_SKIP() << "needs two ranks";
  auto pairs = pg().split(R() / 2, "pairs");
  const uint64_t world_before = pg().last_sequence_number();
  constexpr int kRounds = 40;
  for (int round = 0; round < kRounds; ++round) {
    // p2p inside each pair (a lone last rank of an odd world has no partner).
    if (pairs->size() == 2) {
      at::Tensor out = at::full({257}, round * 10 + pairs->rank(), at::kFloat);
      at::Tensor in = at::empty({257}, at::kFloat);
      const int other = 1 - pairs->rank();
      std::vector<P2POp> ops = pairs->rank() == 0 ? std::vector<P2POp>{P2POp::send(out, other), P2POp::recv(in, other)}
                                                  : std::vector<P2POp>{P2POp::recv(in, other), P2POp::send(out, other)};
      auto works = pairs->batch_isend_irecv(ops);
      // A collective on the world while the pair's messages are in flight.
      at::Tensor sum = at::full({5}, round + R(), at::kLong);
      pg().all_reduce(sum, ReduceOp::Sum);
      EXPECT_EQ(sum[0].item<int64_t>(), int64_t{round} * W() + int64_t{W()} * (W() - 1) / 2);
      for (auto& w : works) w->wait();
      EXPECT_TRUE(at::equal(in, at::full({257}, round * 10 + other, at::kFloat))) << round;
    } else {
      at::Tensor sum = at::full({5}, round + R(), at::kLong);
      pg().all_reduce(sum, ReduceOp::Sum);
    }
    // Rank 0 alone sends to the last rank on the world group: no collective number moves.
    if (R() == 0) pg().send(at::full({3}, round, at::kInt), W() - 1);
    if (R() == W() - 1) {
      at::Tensor t = at::empty({3}, at::kInt);
      pg().recv(t, 0);
      EXPECT_EQ(t[0].item<int>(), round);
    }
    EXPECT_EQ(all_reduced_rank_sum(*pairs), sum_of(pairs->global_ranks()));
  }
  const uint64_t world_calls = pg().last_sequence_number() - world_before;
  EXPECT_EQ(world_calls, static_cast<uint64_t>(kRounds));
  const auto everyone = everyones(static_cast<int64_t>(pg().last_sequence_number()));
  for (auto seq : everyone) EXPECT_EQ(seq, everyone.front());
  EXPECT_EQ(pairs->last_sequence_number(), static_cast<uint64_t>(kRounds));
}

TEST(PointToPoint, BadPeersAreOneLineErrors) {
  at::Tensor t = at::zeros({2});
  EXPECT_ERROR(pg().send(t, R()), "send to rank " + std::to_string(R()) + ": that is this rank itself");
  EXPECT_ERROR(pg().recv(t, W()), "recv from rank " + std::to_string(W()) + ": the group has ranks 0 to " +
                                      std::to_string(W() - 1));
  auto group = pg().split(0, "everyone");
  EXPECT_ERROR(group->send(t, -1), "send to rank -1: the group 'everyone' has ranks 0 to " + std::to_string(W() - 1));
  EXPECT_ERROR(pg().send(at::zeros({4, 4}).t(), (R() + 1) % W()), "send needs a defined, dense, contiguous tensor");
}

// NCCL's rules on CPU (Note [NCCL's rules on CPU] in src/comm/nccl_rules.h), run with
// TANDEM_NCCL_RULES=1 and a short collective timeout (comm.nccl_rules.*): what hangs on NCCL hangs
// here too, and the timeout names the operation; what NCCL runs still runs. Each case has a group of
// its own, since a timeout breaks the group it happens on (as NCCL's watchdog aborts one); two ranks,
// so that both time out together and meet again at the next case.
bool under_rules() { return pg().nccl_rules(); }

// Two ranks that each send, then receive: each send waits for a receive queued behind the other's
// send. Gloo alone finishes this (its sends are buffered); NCCL does not.
TEST(NcclRules, SendThenReceiveOnBothSidesIsADeadlockNamedOnTheSend) {
  if (!under_rules() || W() != 2) GTEST_SKIP() << "needs TANDEM_NCCL_RULES=1 and two ranks";
  auto pair = pg().split(0, "crossed");
  const int other = 1 - pair->rank();
  at::Tensor out = at::full({16}, R(), at::kFloat), in = at::empty({16}, at::kFloat);
  auto send = pair->isend(out, other);
  const std::string received = tandem::test::error_of([&] { pair->recv(in, other); });
  EXPECT_THAT(received, ::testing::HasSubstr("recv of 16 Float on cpu from rank " + std::to_string(other) +
                                             " of group 'crossed'"));
  EXPECT_THAT(received, ::testing::HasSubstr("an earlier operation on group 'crossed' failed: its receive was not "
                                             "posted within"));
  EXPECT_ERROR_HAS(pair->wait(send, "send"), "its receive was not posted within");
}

// The same exchange as one batch (NCCL's group call): it runs.
TEST(NcclRules, SendAndReceiveInOneBatchRun) {
  if (!under_rules() || W() != 2) GTEST_SKIP() << "needs TANDEM_NCCL_RULES=1 and two ranks";
  auto ring = pg().split(0, "ring");
  at::Tensor out = at::full({1000}, R(), at::kFloat), in = at::empty({1000}, at::kFloat);
  std::vector<P2POp> ops{P2POp::send(out, (R() + 1) % W()), P2POp::recv(in, (R() + W() - 1) % W())};
  for (auto& w : ring->batch_isend_irecv(ops)) ring->wait(w, "ring");
  EXPECT_TRUE(at::equal(in, at::full({1000}, (R() + W() - 1) % W(), at::kFloat)));
}

// No tags: a receive takes the next message from its peer, whatever tag either side gave.
TEST(NcclRules, TagsAreIgnoredMessagesComeInTheOrderSent) {
  if (!under_rules() || W() != 2) GTEST_SKIP() << "needs TANDEM_NCCL_RULES=1 and two ranks";
  auto pair = pg().split(0, "untagged");
  if (pair->rank() == 0) {
    auto first = pair->isend(at::full({4}, 3.0), 1, 3);
    auto second = pair->isend(at::full({4}, 7.0), 1, 7);
    pair->wait(first, "first");
    pair->wait(second, "second");
  } else {
    at::Tensor t = at::empty({4});
    pair->recv(t, 0, 7);
    EXPECT_TRUE(at::equal(t, at::full({4}, 3.0))) << "the first message sent came first";
    pair->recv(t, 0, 3);
    EXPECT_TRUE(at::equal(t, at::full({4}, 7.0)));
  }
}

// A group's operations complete in issue order, collectives and point-to-point alike: a collective
// issued behind a send waits for that send's receive.
TEST(NcclRules, ACollectiveWaitsForTheSendIssuedBeforeIt) {
  if (!under_rules() || W() != 2) GTEST_SKIP() << "needs TANDEM_NCCL_RULES=1 and two ranks";
  auto pair = pg().split(0, "ordered");
  at::Tensor t = at::ones({8});
  if (pair->rank() == 0) {
    auto send = pair->isend(at::full({8}, 5.0), 1);
    EXPECT_ERROR_HAS(pair->all_reduce(t), "an earlier operation on group 'ordered' failed");
    EXPECT_ERROR_HAS(pair->wait(send, "send"), "its receive was not posted within");
  } else {
    // Rank 1 reduces first, then receives: on Gloo both finish; on NCCL rank 0's all-reduce is
    // queued behind its send, whose receive is queued behind rank 1's all-reduce.
    EXPECT_ERROR_HAS(pair->all_reduce(t), "all_reduce of 8 Float on cpu (sum) failed on rank 1 of 2 in group 'ordered'");
  }
}

// Run with a short collective timeout (ctest sets TANDEM_TEST_COLLECTIVE_TIMEOUT_MS) at 4 ranks:
// in the group of global ranks {2, 3}, rank 3 does not come; rank 2's error names the group and
// the global rank that is missing, for a collective and for a receive alike.
TEST(SubgroupTimeout, NamesTheGroupAndTheMissingGlobalRank) {
  if (W() != 4) GTEST_SKIP() << "laid out for 4 ranks";
  auto pairs = pg().split(R() / 2, "pairs");
  auto messages = pg().split(R() / 2, "messages");  // its own connections: a timeout closes a group's
  if (R() == 2) {
    at::Tensor t = at::ones({4});
    EXPECT_ERROR_HAS(messages->recv(t, 1),
                     "recv of 4 Float on cpu from rank 1 of group 'messages' (global rank 3), message #1 from that "
                     "rank, failed on rank 0 of group 'messages' (global rank 2): ");
    const std::string reduce = tandem::test::error_of([&] { pairs->all_reduce(t); });
    EXPECT_NE(reduce.find("all_reduce of 4 Float on cpu (sum) failed on rank 0 of 2 in group 'pairs' (global rank 2) "
                          "at collective #1: "),
              std::string::npos) << reduce;
    EXPECT_NE(reduce.find("; rank 1 (global 3) did not arrive"), std::string::npos) << reduce;
    // A group whose connections a timeout closed refuses at once, and says which call it was.
    EXPECT_ERROR_HAS(pairs->send(t, 1), "send of 4 Float on cpu to rank 1 of group 'pairs' (global rank 3), message #1 "
                                        "to that rank, failed on rank 0 of group 'pairs' (global rank 2): ");
    pg().store()->set("subgroup_timeout/done", std::vector<uint8_t>{1});
  } else {
    // Rank 3 stays away from its pair, and everyone waits for rank 2's timeouts off the collectives.
    pg().store()->wait({"subgroup_timeout/done"}, std::chrono::seconds(120));
  }
}

// NCCL (skipped where a rank has no GPU): a subgroup's CUDA collectives, and a ring of CUDA
// tensors in one batch (one coalesced NCCL group).
TEST(NcclSubgroups, CollectivesAndPointToPointOnCudaTensors) {
  if (!tandem::test::every_rank_has_nccl()) GTEST_SKIP() << tandem::test::why_no_nccl();
  const auto on_gpu = at::TensorOptions().device(*pg().cuda_device());
  auto group = pg().split(R() % 2, "parity");
  at::Tensor t = at::full({3}, static_cast<float>(R()), on_gpu);
  group->all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(t.cpu()[0].item<float>(), static_cast<float>(sum_of(group->global_ranks())));
  if (W() < 2) return;
  at::Tensor out = at::arange(1 << 16, on_gpu.dtype(at::kFloat)) + R();
  at::Tensor in = at::empty({1 << 16}, on_gpu.dtype(at::kFloat));
  std::vector<P2POp> ops{P2POp::send(out, (R() + 1) % W()), P2POp::recv(in, (R() + W() - 1) % W())};
  for (auto& work : pg().batch_isend_irecv(ops)) work->wait();
  EXPECT_TRUE(at::equal(in.cpu(), at::arange(1 << 16, at::kFloat) + (R() + W() - 1) % W()));
}

int main(int argc, char** argv) { return tandem::test::distributed_test_main(argc, argv); }

