// The schedules' orders, without processes: every process's actions replayed against the
// pipeline's dependencies (a stage's forward of microbatch i after the previous stage's, its
// backward after the next stage's backward, or after its own forward on the last stage), each
// action as early as its process and its dependencies allow. Every order must finish (no process
// waits in a circle: the real schedules' receives block), run each forward and backward once on
// the stage's process, and leave the bubble of the theory: (P - 1) / (m + P - 1) of the step for
// GPipe and 1F1B, (P - 1) / (v m + P - 1) interleaved, where a stage of v per process takes 1/v of
// a whole stage's time.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tandem/pp/schedule.h"

namespace pp = tandem::pp;

namespace {

struct Replay {
  bool finished = false;
  std::string stuck;    // where it stopped, when it did
  double makespan = 0;  // the step
  double busy = 0;      // one process's compute (the same on every process)
  int most_in_flight = 0;
};

// Forward takes `f`, backward `b` on a whole stage; a stage of v per process a v-th of that.
Replay replay(int p, int v, int m, const std::function<std::vector<pp::Action>(int rank)>& order, double f = 1,
              double b = 2) {
  const int stages = p * v;
  std::vector<std::vector<double>> forward_done(stages, std::vector<double>(m, -1)),
      backward_done(stages, std::vector<double>(m, -1));
  std::vector<std::vector<pp::Action>> actions;
  for (int r = 0; r < p; ++r) actions.push_back(order(r));
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<int> in_flight(p, 0);
  Replay result;
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < actions[r].size()) {
        const pp::Action& a = actions[r][next[r]];
        EXPECT_EQ(a.stage % p, r) << "stage " << a.stage << " on rank " << r;
        const bool forward = a.kind == pp::ActionKind::Forward;
        double ready = 0;
        if (forward) {
          ready = a.stage == 0 ? 0 : forward_done[a.stage - 1][a.microbatch];
        } else {
          ready = a.stage == stages - 1 ? forward_done[a.stage][a.microbatch] : backward_done[a.stage + 1][a.microbatch];
        }
        if (ready < 0) break;  // waits for another process
        auto& done = (forward ? forward_done : backward_done)[a.stage][a.microbatch];
        EXPECT_LT(done, 0) << "stage " << a.stage << " runs microbatch " << a.microbatch << " twice";
        if (!forward) {
          EXPECT_GE(forward_done[a.stage][a.microbatch], 0) << "backward before forward";
        }
        clock[r] = std::max(clock[r], ready) + (forward ? f : b) / v;
        done = clock[r];
        in_flight[r] += forward ? 1 : -1;
        result.most_in_flight = std::max(result.most_in_flight, in_flight[r]);
        ++next[r];
        moved = true;
      }
    }
  }
  result.finished = true;
  for (int r = 0; r < p; ++r) {
    if (next[r] < actions[r].size()) {
      result.finished = false;
      const auto& a = actions[r][next[r]];
      result.stuck += "rank " + std::to_string(r) + " at " + (a.kind == pp::ActionKind::Forward ? "F" : "B") +
                      std::to_string(a.microbatch) + " of stage " + std::to_string(a.stage) + "; ";
    }
  }
  for (int s = 0; s < stages; ++s) {
    for (int i = 0; i < m; ++i) {
      EXPECT_GE(forward_done[s][i], 0) << "stage " << s << " never ran forward " << i;
      EXPECT_GE(backward_done[s][i], 0) << "stage " << s << " never ran backward " << i;
    }
  }
  result.makespan = *std::max_element(clock.begin(), clock.end());
  result.busy = m * (f + b);
  return result;
}

double bubble(const Replay& r) { return 1 - r.busy / r.makespan; }

}  // namespace

TEST(ScheduleOrder, GPipeAnd1F1BFinishWithTheTheorysBubble) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = p; m <= 3 * p + 1; ++m) {
      for (auto [name, order] : {std::pair<const char*, decltype(&pp::gpipe_actions)>{"GPipe", &pp::gpipe_actions},
                                 {"1F1B", &pp::one_f_one_b_actions}}) {
        const Replay r = replay(p, 1, m, [&](int rank) { return order(p, rank, m); });
        ASSERT_TRUE(r.finished) << name << " P " << p << " m " << m << ": " << r.stuck;
        EXPECT_NEAR(bubble(r), double(p - 1) / (m + p - 1), 1e-12) << name << " P " << p << " m " << m;
      }
    }
  }
}

TEST(ScheduleOrder, InterleavedFinishesWithTheBubbleCutByV) {
  for (int p = 1; p <= 6; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m = p; m <= 4 * p; m += p) {
        for (double b : {1.0, 2.0}) {
          const Replay r = replay(p, v, m, [&](int rank) { return pp::interleaved_actions(p, v, rank, m); }, 1, b);
          ASSERT_TRUE(r.finished) << "P " << p << " v " << v << " m " << m << ": " << r.stuck;
          EXPECT_NEAR(bubble(r), double(p - 1) / (v * m + p - 1), 1e-12)
              << "P " << p << " v " << v << " m " << m << " backward " << b;
        }
      }
    }
  }
}

// 1F1B's point: stage s holds at most P - s microbatches' activations (GPipe: all m).
TEST(ScheduleOrder, OneFOneBBoundsTheMicrobatchesInFlight) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = p; m <= 3 * p + 1; ++m) {
      for (int r = 0; r < p; ++r) {
        auto most = [](const std::vector<pp::Action>& actions) {
          int now = 0, top = 0;
          for (const auto& a : actions) top = std::max(top, now += a.kind == pp::ActionKind::Forward ? 1 : -1);
          EXPECT_EQ(now, 0);
          return top;
        };
        EXPECT_EQ(most(pp::one_f_one_b_actions(p, r, m)), std::min(p - r, m));
        EXPECT_EQ(most(pp::gpipe_actions(p, r, m)), m);
      }
    }
  }
}

// What NCCL (no tags) needs: between two processes, the messages of every stream together arrive
// in the order the receiver takes them. A process sends an activation at each forward of a stage
// that is not the last, and a gradient at each backward of one that is not the first; it takes
// them at the next stage's forward and the previous stage's backward.
TEST(ScheduleOrder, InterleavedMessagesBetweenTwoProcessesComeInTheOrderTakenWithoutTags) {
  for (int p = 2; p <= 6; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m = p; m <= 4 * p; m += p) {
        const int stages = p * v;
        // By (from, to): the labels (2 s for stage s's activation, 2 s + 1 for its gradient, then
        // the microbatch) in the sender's order, and in the receiver's.
        std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> sent, taken;
        for (int r = 0; r < p; ++r) {
          for (const auto& a : pp::interleaved_actions(p, v, r, m)) {
            if (a.kind == pp::ActionKind::Forward) {
              if (a.stage + 1 < stages) sent[{r, (a.stage + 1) % p}].push_back({2 * a.stage, a.microbatch});
              if (a.stage > 0) taken[{(a.stage - 1) % p, r}].push_back({2 * (a.stage - 1), a.microbatch});
            } else {
              if (a.stage > 0) sent[{r, (a.stage - 1) % p}].push_back({2 * a.stage + 1, a.microbatch});
              if (a.stage + 1 < stages) taken[{(a.stage + 1) % p, r}].push_back({2 * (a.stage + 1) + 1, a.microbatch});
            }
          }
        }
        EXPECT_EQ(sent, taken) << "P " << p << " v " << v << " m " << m;
      }
    }
  }
}
