#include "tandem/pp/schedule.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "common/cpu_memory_tracker.h"
#include "tandem/comm/agreement.h"
#include "tandem/error.h"

namespace tandem::pp {

// Note [Pipeline step]
// Each process runs its own list of actions (forward or backward of microbatch i on stage s) in
// order; between neighbouring stages activations flow one way and gradients the other, without
// tags, as on NCCL. Messages go in batches that follow one grid for the whole pipeline (Note
// [Batched exchanges]), so that no two processes wait in a circle under NCCL's rules (replayed
// for every order in tests/pp/schedule_order_test.cpp); an action waits for the message it needs,
// a send is waited for once the neighbour is known to have it (Note [Releasing sends] in
// stage.cpp). Every step starts
// with one all-gather of the batch size, so every stage knows each microbatch's size and a bad
// batch stops every stage at once.
// - Forward i on stage s: stage 0 takes microbatch i of the inputs; the others receive it, and
//   mark it as needing a gradient (what they send back). The last stage computes the loss of its
//   output against microbatch i of the targets; the others send the output on. Each keeps what
//   backward needs: the input and the output (the last stage, the scaled loss).
// - Backward i on stage s: the last stage runs backward from the loss scaled by n_i / n (Mean) or
//   1 (Sum); the others receive the gradient of their output and run backward from it. All but
//   stage 0 send their input's gradient back. Parameters accumulate the gradients of all
//   microbatches: the whole batch's, as one process on the whole batch would have them.
// - Neighbouring stages on the same process (one process holding every stage) hand their
//   tensors over in memory, copied as a message would be.
// - PP x DDP: a stage whose module is a DDP replica runs every forward of the step with
//   synchronisation off, so that no backward but one touches the reducer; before its last
//   backward in this process's order the schedule arms the reducer with that microbatch's output
//   (DDP's prepare_for_backward), and that backward averages the sum of all the microbatches'
//   gradients across the replicas, bucket by bucket as they become ready: one all-reduce per
//   bucket per step, as PyTorch's pipeline stages do with no_sync and prepare_for_backward.
// - The end: every send is waited for, so that the step's messages are all delivered before the
//   optimizer changes the weights and the next step begins.
//
// Note [Step measurements]
// A step measures its wall time and the time this process is blocked on a neighbour (in its
// receives, and waiting for its sends at the end): the bubble as this process saw it, which an
// ideal pipeline of P equal stages puts at (P - 1) / (m + P - 1) of the step. With track_memory,
// allocations on the CPU by this thread during the step are counted (CpuMemoryTracker's
// allocator): the peak above what was alive at the start is what the step's activations and
// backward's transients took at once; on the first step it also holds the gradients' first
// allocation. CUDA allocations are not counted (the caching allocator keeps its own peak).

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// "sending the activation of microbatch 2 to rank 3": a message as the failure lines name it.
std::string describe(const Transfer& t) {
  return std::string(t.send ? "sending" : "receiving") + " the " + (t.message.gradient ? "gradient" : "activation") +
         " of microbatch " + std::to_string(t.message.microbatch) + (t.send ? " to" : " from") + " rank " +
         std::to_string(t.peer);
}

// A batched exchange failed: the line names the stage and the message(s), as an action's failure
// names the stage and the microbatch (Note [The first failed stage] in stage.cpp).
struct MessageFailed : Error {
  MessageFailed(Stage& stage, const std::string& what, const std::exception& e)
      : Error("pp: stage " + std::to_string(stage.index()) + " failed " + what + ": " + one_line(e)), stage(stage) {}
  Stage& stage;
};

}  // namespace

std::vector<Action> gpipe_actions(int processes, int rank, int microbatches) {
  (void)processes;
  std::vector<Action> actions;
  for (int i = 0; i < microbatches; ++i) actions.push_back({ActionKind::Forward, i, rank});
  for (int i = 0; i < microbatches; ++i) actions.push_back({ActionKind::Backward, i, rank});
  return actions;
}

std::vector<Action> one_f_one_b_actions(int processes, int rank, int microbatches) {
  // Stage s first fills the pipeline below it (P - s - 1 forwards), then alternates.
  std::vector<Action> actions;
  const int warmup = std::min(processes - rank - 1, microbatches);
  for (int i = 0; i < warmup; ++i) actions.push_back({ActionKind::Forward, i, rank});
  for (int k = 0; k + warmup < microbatches; ++k) {
    actions.push_back({ActionKind::Forward, warmup + k, rank});
    actions.push_back({ActionKind::Backward, k, rank});
  }
  for (int k = microbatches - warmup; k < microbatches; ++k) actions.push_back({ActionKind::Backward, k, rank});
  return actions;
}

std::vector<Action> interleaved_actions(int processes, int stages_per_process, int rank, int microbatches) {
  // Megatron-LM's order (Narayanan et al. 2021): the k-th forward of a process runs its stage
  // (k / P) mod v on microbatch (k / (P v)) P + k mod P, so microbatches go P at a time through
  // each of its stages in turn; the k-th backward likewise from its last stage. A process first
  // runs the forwards that fill the pipeline below it, 2 (P - r - 1) + (v - 1) P of them, then
  // alternates one forward and one backward, then runs the last backwards.
  const int p = processes, v = stages_per_process, total = microbatches * v;
  auto microbatch = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward = [&](int k) { return Action{ActionKind::Forward, microbatch(k), ((k / p) % v) * p + rank}; };
  auto backward = [&](int k) { return Action{ActionKind::Backward, microbatch(k), (v - 1 - (k / p) % v) * p + rank}; };
  const int warmup = std::min(2 * (p - rank - 1) + (v - 1) * p, total);
  std::vector<Action> actions;
  for (int k = 0; k < warmup; ++k) actions.push_back(forward(k));
  for (int k = 0; k + warmup < total; ++k) {
    actions.push_back(forward(warmup + k));
    actions.push_back(backward(k));
  }
  for (int k = total - warmup; k < total; ++k) actions.push_back(backward(k));
  return actions;
}

Schedule::Schedule(std::vector<Stage*> stages, int microbatches, LossFn loss, ScheduleOptions options,
                   const char* name, bool many_per_process)
    : stages_(std::move(stages)), microbatches_(microbatches), loss_(std::move(loss)), options_(options) {
  TANDEM_CHECK(!stages_.empty() && std::none_of(stages_.begin(), stages_.end(), [](Stage* s) { return !s; }),
               "pp: ", name, " needs this process's stages");
  std::sort(stages_.begin(), stages_.end(), [](Stage* a, Stage* b) { return a->index() < b->index(); });
  const Stage& first = *stages_.front();
  const int p = first.group().size(), v = first.num_stages() / p;
  // Every process runs the same schedule (Note [Agreement before waiting] in docs/design/comm.md):
  // checked before the local rules below, so that one process's refusal does not leave the others
  // waiting here.
  comm::Agreement("pp: the schedule")
      .field("kind", name)
      .field("microbatches", microbatches_)
      .field("stages given to it", static_cast<int>(stages_.size()))
      .field("loss reduction", options_.reduction() == at::Reduction::Sum ? "sum" : "mean")
      .check(first.group());
  TANDEM_CHECK(many_per_process || v == 1, "pp: ", name, " runs one stage per process, and this pipeline has ",
               first.num_stages(), " stages over ", p, " processes: use ScheduleInterleaved1F1B");
  std::string given;
  for (const Stage* s : stages_) {
    TANDEM_CHECK(&s->group() == &first.group() && s->num_stages() == first.num_stages(), "pp: ", name,
                 "'s stages must be of one pipeline (one group, one number of stages)");
    given += (given.empty() ? "" : ", ") + std::to_string(s->index());
  }
  std::string expected;
  for (int k = 0; k < v; ++k) expected += (k ? ", " : "") + std::to_string(k * p + first.group().rank());
  TANDEM_CHECK(given == expected, "pp: ", name, " runs every stage this process holds (", expected, " of ",
               first.num_stages(), "); it was given ", given);
  TANDEM_CHECK(loss_, "pp: ", name, " needs a loss function");
  TANDEM_CHECK(microbatches_ >= p, "pp: ", name, " with ", microbatches_, " microbatches over ", p,
               " processes: a pipeline needs at least as many microbatches as processes to fill");
  TANDEM_CHECK(options_.reduction() == at::Reduction::Mean || options_.reduction() == at::Reduction::Sum,
               "pp: the loss's reduction must be Mean or Sum");
  if (options_.track_memory()) memory_ = std::make_unique<CpuMemoryTracker>(1);
}

Schedule::~Schedule() = default;

Stage& Schedule::stage(int index) const { return *stages_[static_cast<size_t>(index / stages_.front()->group().size())]; }

bool Schedule::holds(int index) const {
  return index >= 0 && index < stages_.front()->num_stages() &&
         stages_.front()->rank_of(index) == stages_.front()->group().rank();
}

void Schedule::set_order(const std::function<std::vector<Action>(int rank)>& order) {
  const Stage& first = *stages_.front();
  actions_ = order(first.group().rank());
  backwards_before_.assign(stages_.size(), std::vector<int>(static_cast<size_t>(microbatches_), 0));
  last_backward_.assign(stages_.size(), -1);
  for (const Action& a : actions_) {
    if (a.kind == ActionKind::Backward) last_backward_[static_cast<size_t>(a.stage / first.group().size())] = a.microbatch;
  }
  plan_ = exchange_plan(order, first.group().size(), first.num_stages(), first.group().rank());
  // evaluate()'s: the forwards alone, in the same order.
  const auto forwards_of = [&order](int rank) {
    std::vector<Action> forwards;
    for (const Action& a : order(rank)) {
      if (a.kind == ActionKind::Forward) forwards.push_back(a);
    }
    return forwards;
  };
  forward_actions_ = forwards_of(first.group().rank());
  forward_plan_ = exchange_plan(forwards_of, first.group().size(), first.num_stages(), first.group().rank());
  for (size_t k = 0; k < stages_.size(); ++k) {
    const int s = stages_[k]->index();
    if (s == 0 || holds(s - 1)) continue;
    int backwards = 0;
    for (const Action& a : order(first.rank_of(s - 1))) {
      if (a.stage != s - 1) continue;
      if (a.kind == ActionKind::Backward) ++backwards;
      if (a.kind == ActionKind::Forward) backwards_before_[k][static_cast<size_t>(a.microbatch)] = backwards;
    }
  }
}

// What a step keeps between its actions.
struct Schedule::State {
  std::vector<at::Tensor> xs, ys;  // the microbatches (where stage 0, and the last, run)
  int64_t total = 0;               // samples in the batch (agreed by every stage)
  std::vector<int64_t> rows;       // samples in each microbatch (every stage knows them)
  // By stage (its position in stages_), then microbatch: what backward needs.
  std::vector<std::vector<at::Tensor>> in, out, scaled;
  std::vector<at::Tensor> losses;
  // Tensors handed over in memory, by the stage that takes them.
  std::map<int, std::deque<at::Tensor>> activations, gradients;
  // Sends produced and not yet issued: they go with the step's batch (Note [Batched exchanges]).
  struct Outgoing {
    Message message;
    Stage* stage;
    std::vector<comm::P2POp> ops;
  };
  std::vector<Outgoing> outbox;
  // Receives issued and not yet taken by the action that needs them.
  struct Incoming {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor tensor;
    Stage* stage;
  };
  std::map<Message, Incoming> mailbox;
  double blocked_seconds = 0;
};

void Schedule::agree_on_batch(State& state, int64_t inputs, int64_t targets) const {
  const int m = microbatches_;
  const Stage& first = *stages_.front();
  comm::ProcessGroup& group = first.group();
  int64_t n = inputs, t = targets;
  if (group.size() > 1) {
    // One all-gather of two numbers: what each process read (-1: not its stage).
    const auto parts = group.all_gather(at::tensor({inputs, targets}, at::kLong));
    const auto* firsts = parts[static_cast<size_t>(first.rank_of(0))].data_ptr<int64_t>();
    const auto* lasts = parts[static_cast<size_t>(first.rank_of(first.num_stages() - 1))].data_ptr<int64_t>();
    n = firsts[0];
    t = lasts[1];
  }
  TANDEM_CHECK(n >= 0, "pp: the first stage (rank ", first.rank_of(0), ") was given no inputs");
  TANDEM_CHECK(t < 0 || t == n, "pp: the first stage (rank ", first.rank_of(0), ") has a batch of ", n,
               " samples and the last (rank ", first.rank_of(first.num_stages() - 1), ") ", t, " targets");
  TANDEM_CHECK(n >= m, "pp: a batch of ", n, " in ", m, " microbatches: each needs at least one sample");
  state.total = n;
  state.rows.clear();
  for (int i = 0; i < m; ++i) state.rows.push_back(n / m + (i < n % m ? 1 : 0));  // as at::tensor_split
}

std::vector<at::Tensor> Schedule::step(const at::Tensor& inputs, const at::Tensor& targets) {
  const auto start = Clock::now();
  const int m = microbatches_;
  State state;
  const bool first = stages_.front()->is_first(), last = stages_.back()->is_last();
  if (first) {
    TANDEM_CHECK(inputs.defined() && inputs.dim() > 0, "pp: stage 0 needs the inputs (the first stage reads them)");
  }
  if (last) {
    TANDEM_CHECK(targets.defined() && targets.dim() > 0, "pp: stage ", stages_.back()->index(),
                 " needs the targets (the last stage reads them)");
  }
  agree_on_batch(state, first ? inputs.size(0) : -1, last ? targets.size(0) : -1);
  if (first) state.xs = at::tensor_split(inputs, m, 0);
  if (last) state.ys = at::tensor_split(targets, m, 0);
  for (auto* kept : {&state.in, &state.out, &state.scaled}) {
    kept->assign(stages_.size(), std::vector<at::Tensor>(static_cast<size_t>(m)));
  }
  std::optional<CpuMemoryTracker::Scope> counting;
  int64_t alive_before = 0;
  if (memory_) {
    counting.emplace(*memory_, 0);
    alive_before = memory_->live(0);
    memory_->reset_peaks();
  }
  // Data-parallel stages: every forward unsynchronised, the last backward armed (in run()).
  struct SyncOff {
    std::vector<Stage*> stages;
    ~SyncOff() {
      for (Stage* s : stages) s->data_parallel_sync().require(true);
    }
  } sync_off;
  for (Stage* s : stages_) {
    if (!s->data_parallel_sync()) continue;
    s->data_parallel_sync().require(false);
    sync_off.stages.push_back(s);
  }
  run_plan(plan_, actions_, state, /*evaluating=*/false, nullptr);
  const auto sends = Clock::now();
  for (Stage* s : stages_) s->wait_sends();
  state.blocked_seconds += seconds_since(sends);
  measured_.seconds = seconds_since(start);
  measured_.blocked_seconds = state.blocked_seconds;
  if (memory_) measured_.peak_bytes = memory_->peak(0) - alive_before;
  return std::move(state.losses);
}

at::Tensor Schedule::evaluate(const at::Tensor& inputs) {
  at::NoGradGuard no_grad;
  const int m = microbatches_;
  State state;
  std::vector<at::Tensor> outputs;
  const bool first = stages_.front()->is_first();
  if (first) {
    TANDEM_CHECK(inputs.defined() && inputs.dim() > 0 && inputs.size(0) >= m, "pp: evaluate needs a batch of at least ",
                 m, " samples on the first stage (one per microbatch)");
  }
  agree_on_batch(state, first ? inputs.size(0) : -1, -1);
  if (first) state.xs = at::tensor_split(inputs, m, 0);
  run_plan(forward_plan_, forward_actions_, state, /*evaluating=*/true, &outputs);
  for (Stage* s : stages_) s->wait_sends();
  return outputs.empty() ? at::Tensor() : at::cat(outputs, 0);
}

at::Tensor Schedule::take(std::map<int, std::deque<at::Tensor>>& box, const Action& a) {
  auto& queue = box[a.stage];
  TANDEM_CHECK(!queue.empty(), "pp: stage ", a.stage, " has nothing handed over for microbatch ", a.microbatch,
               " (the schedule's order is broken)");
  at::Tensor t = queue.front();
  queue.pop_front();
  return t;
}

// Note [Batched exchanges]
// On NCCL a send does not complete before its receive is posted, and a group's operations run one
// after the other (Note [NCCL's rules on CPU] in src/comm/nccl_rules.h). 1F1B issued as single
// operations then deadlocks: stage s sends the activation of its forward i and then waits for the
// gradient of backward j, while stage s + 1 sends that gradient and then waits for activation
// i + 1: each send waits for a receive queued behind the other's send. Batching each send with the
// process's next receive (PyTorch's Schedule1F1B) mends 1F1B and GPipe, but not interleaved 1F1B,
// where a lone gradient send can still block a stream (found by the replay in
// tests/pp/schedule_order_test.cpp). So, as PyTorch's PipelineScheduleMulti, the exchanges follow
// one grid for the whole pipeline: every process's actions placed at unit-time steps, each as
// early as its process and the actions it needs allow. At each step every process issues one batch
// (NCCL's group call): the message its action at that step produced, and the receives of what its
// neighbours' actions at that step produced for it. The batches of one step pair up exactly, and
// every process issues them in step order, so by induction over the steps none waits in a circle,
// whatever the backend buffers; and a receive is posted as soon as its message exists, not when
// the action that needs it comes. A process waits only for the receives its actions need (the
// rest of a batch completes on its own), and between two processes at most one message goes each
// way per step, so messages pair up without tags. The price: a backward twice a forward's time
// leaves up to 2 points more bubble than the theory at P = 6, v >= 2 (the grid is unit-time).
std::vector<PlanStep> exchange_plan(const std::function<std::vector<Action>(int rank)>& order, int processes,
                                    int stages, int rank) {
  const int p = processes;
  std::vector<std::vector<Action>> actions;
  for (int r = 0; r < p; ++r) actions.push_back(order(r));
  // The grid: each action at the first step its process is free and what it needs is done.
  std::map<std::tuple<bool, int, int>, int> done;  // (backward, stage, microbatch) -> step after it
  std::vector<std::vector<int>> at(static_cast<size_t>(p));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<int> free(static_cast<size_t>(p), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      auto& k = next[static_cast<size_t>(r)];
      while (k < actions[r].size()) {
        const Action& a = actions[r][k];
        const bool forward = a.kind == ActionKind::Forward;
        std::optional<std::tuple<bool, int, int>> needs;
        if (forward && a.stage > 0) needs = std::make_tuple(false, a.stage - 1, a.microbatch);
        if (!forward) {
          needs = a.stage == stages - 1 ? std::make_tuple(false, a.stage, a.microbatch)
                                        : std::make_tuple(true, a.stage + 1, a.microbatch);
        }
        int ready = 0;
        if (needs) {
          auto it = done.find(*needs);
          if (it == done.end()) break;
          ready = it->second;
        }
        const int step = std::max(free[static_cast<size_t>(r)], ready);
        at[static_cast<size_t>(r)].push_back(step);
        free[static_cast<size_t>(r)] = step + 1;
        done[std::make_tuple(!forward, a.stage, a.microbatch)] = step + 1;
        ++k;
        moved = true;
      }
    }
  }
  int steps = 0;
  for (int r = 0; r < p; ++r) {
    TANDEM_CHECK(next[static_cast<size_t>(r)] == actions[r].size(), "pp: the schedule's orders cannot all run: rank ",
                 r, " stops at its action ", next[static_cast<size_t>(r)]);
    steps = std::max(steps, free[static_cast<size_t>(r)]);
  }
  // What an action sends, and to which process: nothing when the neighbour stage is on its own.
  auto produced = [&](const Action& a) -> std::optional<std::pair<Message, int>> {
    const bool forward = a.kind == ActionKind::Forward;
    const int to = forward ? a.stage + 1 : a.stage - 1;
    if (to < 0 || to >= stages || to % p == a.stage % p) return std::nullopt;
    return std::make_pair(Message{!forward, a.stage, a.microbatch}, to % p);
  };
  std::vector<std::map<int, size_t>> by_step(static_cast<size_t>(p));  // step -> action index
  for (int r = 0; r < p; ++r) {
    for (size_t k = 0; k < actions[r].size(); ++k) by_step[static_cast<size_t>(r)][at[static_cast<size_t>(r)][k]] = k;
  }
  std::vector<PlanStep> plan;
  for (int t = 0; t < steps; ++t) {
    PlanStep step;
    auto mine = by_step[static_cast<size_t>(rank)].find(t);
    if (mine != by_step[static_cast<size_t>(rank)].end()) step.action = mine->second;
    for (int r = 0; r < p; ++r) {
      auto it = by_step[static_cast<size_t>(r)].find(t);
      if (it == by_step[static_cast<size_t>(r)].end()) continue;
      const auto message = produced(actions[r][it->second]);
      if (!message) continue;
      if (r == rank) step.batch.push_back({message->first, message->second, true});
      if (message->second == rank) step.batch.push_back({message->first, r, false});
    }
    if (step.action || !step.batch.empty()) plan.push_back(std::move(step));
  }
  return plan;
}

void Schedule::run_plan(const std::vector<PlanStep>& plan, const std::vector<Action>& actions, State& state,
                        bool evaluating, std::vector<at::Tensor>* outputs) {
  for (const PlanStep& step : plan) {
    if (step.action) {
      const Action& a = actions[*step.action];
      Stage& st = stage(a.stage);
      // A failure names the stage, the action and the microbatch, led by the pipeline's first
      // failure (Note [The first failed stage] in stage.cpp); the launcher stops the other stages.
      try {
        if (evaluating) {
          at::Tensor y = st.forward(input_of(a, state));
          if (st.is_last()) {
            outputs->push_back(y);
          } else {
            pass_on(a, y, state);
          }
        } else {
          run(a, state);
        }
      } catch (const std::exception& e) {
        throw Error(st.explain_failure(
            "pp: stage " + std::to_string(a.stage) + " failed in the " +
            (evaluating ? "evaluation" : a.kind == ActionKind::Forward ? "forward" : "backward") + " of microbatch " +
            std::to_string(a.microbatch) + ": " + one_line(e)));
      }
    }
    if (step.batch.empty()) continue;
    try {
      exchange(step.batch, state);
    } catch (const MessageFailed& e) {
      throw Error(e.stage.explain_failure(one_line(e)));
    } catch (const std::exception& e) {
      std::string what = "exchanging a step's messages (";
      for (size_t i = 0; i < step.batch.size(); ++i) what += (i ? ", " : "") + describe(step.batch[i]);
      Stage& st = *stages_.front();
      throw Error(st.explain_failure(MessageFailed(st, what + ")", e).what()));
    }
  }
  TANDEM_CHECK(state.outbox.empty() && state.mailbox.empty(), "pp: messages left at the end of the step (the schedule's "
               "plan is broken)");
}

// Note [Shapes before values]
// A step's batch goes in two parts when it carries a shape (Note [Activation shapes] in
// stage.cpp): first every header of the step, sent and received as one batch and waited for, then
// the values, whose receives need the shapes. One batch for both would deadlock on NCCL where two
// processes each receive a shape from the other at the same step: a batch completes as a whole,
// and each one's values send would wait for a receive the other can post only after its batch.
// Both sides know which messages carry a header (the same rule on both), so the parts pair up.
void Schedule::exchange(const std::vector<Transfer>& batch, State& state) {
  comm::ProcessGroup& group = stages_.front()->group();
  std::vector<comm::P2POp> headers, values;
  // Where each message's operations are: its header's (if any) and its values'.
  struct Placed {
    Transfer transfer;
    Stage* stage;
    std::optional<size_t> header;
    size_t value = 0;
    State::Outgoing out;
  };
  std::vector<Placed> placed;
  for (const Transfer& t : batch) {
    Placed p{t, nullptr, std::nullopt, 0, {}};
    const Message& m = t.message;
    if (t.send) {
      auto it = std::find_if(state.outbox.begin(), state.outbox.end(),
                             [&](const State::Outgoing& o) { return o.message == m; });
      TANDEM_CHECK(it != state.outbox.end(), "pp: a send the plan names was not produced (the schedule's plan is broken)");
      p.out = std::move(*it);
      state.outbox.erase(it);
      p.stage = p.out.stage;
      if (p.out.ops.size() == 2) {  // header, then values (Stage::activation_sends)
        p.header = headers.size();
        headers.push_back(p.out.ops.front());
      }
      p.value = values.size();
      values.push_back(p.out.ops.back());
    } else if (m.gradient) {
      p.stage = &stage(m.from - 1);
      const size_t k = static_cast<size_t>(p.stage->index() / p.stage->group().size());
      p.value = values.size();
      values.push_back(p.stage->gradient_receive(state.out[k][static_cast<size_t>(m.microbatch)]));
    } else {
      p.stage = &stage(m.from + 1);
      const Stage::Receive rx = p.stage->activation_receive(state.rows[static_cast<size_t>(m.microbatch)]);
      if (rx.header_first) {
        p.header = headers.size();
        headers.push_back(rx.op);
      } else {
        p.value = values.size();
        values.push_back(rx.op);
      }
    }
    placed.push_back(std::move(p));
  }
  TANDEM_CHECK(state.outbox.empty(), "pp: a send produced outside the plan (the schedule's plan is broken)");
  // Note [Shapes before values].
  std::vector<c10::intrusive_ptr<c10d::Work>> header_works;
  if (!headers.empty()) {
    const auto start = Clock::now();
    header_works = group.batch_isend_irecv(headers);
    for (const Placed& p : placed) {
      if (!p.header) continue;
      try {
        group.wait(header_works[*p.header], "the shape's " + std::string(p.transfer.send ? "send" : "receive"));
      } catch (const std::exception& e) {
        throw MessageFailed(*p.stage, describe(p.transfer) + " (its shape)", e);
      }
    }
    state.blocked_seconds += seconds_since(start);
    for (Placed& p : placed) {
      if (p.transfer.send || !p.header) continue;
      p.value = values.size();
      values.push_back(p.stage->activation_after_header(headers[*p.header].tensor,
                                                        state.rows[static_cast<size_t>(p.transfer.message.microbatch)]));
    }
  }
  auto works = group.batch_isend_irecv(values);
  for (Placed& p : placed) {
    const Message& m = p.transfer.message;
    if (p.transfer.send) {
      // The works of the sends must live until they complete (Note [Releasing sends]); a
      // header's has been waited for already (a Gloo work is waited for once).
      p.stage->keep_sends(m.gradient, m.microbatch, {works[p.value]}, {values[p.value].tensor});
    } else {
      state.mailbox[m] = State::Incoming{works[p.value], values[p.value].tensor, p.stage};
    }
  }
}

at::Tensor Schedule::take_message(const Message& m, State& state) {
  auto it = state.mailbox.find(m);
  TANDEM_CHECK(it != state.mailbox.end(), "pp: stage ", m.gradient ? m.from - 1 : m.from + 1, " has no message for ",
               m.gradient ? "the gradient" : "the activation", " of microbatch ", m.microbatch,
               " (the schedule's plan is broken)");
  State::Incoming in = std::move(it->second);
  state.mailbox.erase(it);
  const auto start = Clock::now();
  in.stage->group().wait(in.work, "pp: stage " + std::to_string(in.stage->index()) + "'s receive of the " +
                                      (m.gradient ? "gradient" : "activation") + " of microbatch " +
                                      std::to_string(m.microbatch));
  state.blocked_seconds += seconds_since(start);
  // Note [Releasing sends] in stage.cpp.
  if (m.gradient) {
    in.stage->release_activation_send(m.microbatch);  // its gradient came back: it was taken
  } else {
    const size_t k = static_cast<size_t>(in.stage->index() / in.stage->group().size());
    in.stage->release_gradient_sends_before(backwards_before_[k][static_cast<size_t>(m.microbatch)]);
  }
  return in.tensor.to(in.stage->module_device());
}

at::Tensor Schedule::input_of(const Action& a, State& state) {
  Stage& st = stage(a.stage);
  if (st.is_first()) return state.xs[static_cast<size_t>(a.microbatch)];
  if (holds(a.stage - 1)) return take(state.activations, a);
  return take_message(Message{false, a.stage - 1, a.microbatch}, state);
}

void Schedule::pass_on(const Action& a, const at::Tensor& y, State& state) {
  if (holds(a.stage + 1)) {
    state.activations[a.stage + 1].push_back(y.detach().clone());  // a copy, as a message is
  } else {
    Stage& st = stage(a.stage);
    state.outbox.push_back({Message{false, a.stage, a.microbatch}, &st,
                            st.activation_sends(y, state.rows[static_cast<size_t>(a.microbatch)])});
  }
}

void Schedule::run(const Action& a, State& state) {
  Stage& st = stage(a.stage);
  const size_t k = static_cast<size_t>(a.stage / st.group().size());  // the stage's place in stages_
  const size_t i = static_cast<size_t>(a.microbatch);
  if (a.kind == ActionKind::Forward) {
    at::Tensor x = input_of(a, state);
    if (!st.is_first()) {
      TANDEM_CHECK(at::isFloatingType(x.scalar_type()), "pp: stage ", a.stage, " received a ",
                   c10::toString(x.scalar_type()), " activation: what flows between stages must be floating point "
                   "(its gradient flows back)");
      x.requires_grad_(true);
    }
    at::Tensor y = st.forward(x);
    if (st.is_last()) {
      at::Tensor loss = loss_(y, state.ys[i]);
      TANDEM_CHECK(loss.numel() == 1, "pp: the loss function returned ", loss.numel(), " values, not one");
      const double weight = options_.reduction() == at::Reduction::Mean
                                ? static_cast<double>(state.ys[i].size(0)) / static_cast<double>(state.total)
                                : 1.0;
      state.scaled[k][i] = loss * weight;
      // A copy: a reduced loss may be a view of a buffer as large as the microbatch's output
      // (at::mse_loss's is), which the step would otherwise keep for every microbatch.
      state.losses.push_back(loss.detach().clone());
    } else {
      pass_on(a, y, state);
      state.out[k][i] = y;
    }
    state.in[k][i] = x;
  } else {
    if (st.data_parallel_sync() && a.microbatch == last_backward_[k]) {
      // The stage's last backward of the step: it averages the sum of all microbatches'
      // gradients across the data-parallel replicas, once, overlapped with this backward. It
      // starts from the output, or on the last stage from the loss (which reaches all it does).
      st.data_parallel_sync().arm(st.is_last() ? state.scaled[k][i] : state.out[k][i]);
    }
    if (st.is_last()) {
      state.scaled[k][i].backward();
      state.scaled[k][i] = at::Tensor();
    } else {
      const at::Tensor& y = state.out[k][i];
      const at::Tensor grad =
          holds(a.stage + 1) ? take(state.gradients, a) : take_message(Message{true, a.stage + 1, a.microbatch}, state);
      TANDEM_CHECK(grad.defined(), "pp: stage ", a.stage, " received no gradient for microbatch ", a.microbatch,
                   " (the schedule's order is broken)");
      torch::autograd::backward({y}, {grad});
      state.out[k][i] = at::Tensor();
    }
    if (!st.is_first()) {
      const at::Tensor& x = state.in[k][i];
      const at::Tensor grad = x.grad().defined() ? x.grad() : at::zeros_like(x);
      if (holds(a.stage - 1)) {
        state.gradients[a.stage - 1].push_back(grad.clone());
      } else {
        state.outbox.push_back({Message{true, a.stage, a.microbatch}, &st, st.gradient_sends(grad)});
      }
    }
    state.in[k][i] = at::Tensor();
  }
}

ScheduleGPipe::ScheduleGPipe(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options)
    : Schedule({&stage}, microbatches, std::move(loss), options, "GPipe", /*many_per_process=*/false) {
  const int p = stage.group().size();
  set_order([p, microbatches](int rank) { return gpipe_actions(p, rank, microbatches); });
}

Schedule1F1B::Schedule1F1B(Stage& stage, int microbatches, LossFn loss, ScheduleOptions options)
    : Schedule({&stage}, microbatches, std::move(loss), options, "1F1B", /*many_per_process=*/false) {
  const int p = stage.group().size();
  set_order([p, microbatches](int rank) { return one_f_one_b_actions(p, rank, microbatches); });
}

ScheduleInterleaved1F1B::ScheduleInterleaved1F1B(std::vector<Stage*> stages, int microbatches, LossFn loss,
                                                 ScheduleOptions options)
    : Schedule(std::move(stages), microbatches, std::move(loss), options, "interleaved 1F1B",
               /*many_per_process=*/true) {
  const comm::ProcessGroup& group = stages_.front()->group();
  const int p = group.size();
  TANDEM_CHECK(microbatches % p == 0, "pp: interleaved 1F1B with ", microbatches, " microbatches over ", p,
               " processes: the microbatches must be a multiple of the processes (they go through each stage ", p,
               " at a time)");
  const int v = static_cast<int>(stages_.size());
  set_order([p, v, microbatches](int rank) { return interleaved_actions(p, v, rank, microbatches); });
}

}  // namespace tandem::pp
