#include "tandem/pp/schedule.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "common/cpu_memory_tracker.h"
#include "tandem/error.h"

namespace tandem::pp {

// Note [Pipeline step]
// Each process runs its own list of actions (forward or backward of microbatch i on stage s) in
// order; between neighbouring stages activations flow one way and gradients the other, each
// stream in its own order and with its own tag (Note [Stage tags] in stage.cpp), and every
// list takes a stream's messages in the order the neighbour sends them. That, and the schedules'
// orders being free of waits in a circle (the simulations of tests/pp/schedule_order_test.cpp),
// is all a pipeline needs: sends are asynchronous (kept until the end of the step), receives
// block.
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
  int64_t total = 0;               // samples in the batch
  // By stage (its position in stages_), then microbatch: what backward needs.
  std::vector<std::vector<at::Tensor>> in, out, scaled;
  std::vector<at::Tensor> losses;
  // Tensors handed over in memory, by the stage that takes them.
  std::map<int, std::deque<at::Tensor>> activations, gradients;
  double blocked_seconds = 0;
};

std::vector<at::Tensor> Schedule::step(const at::Tensor& inputs, const at::Tensor& targets) {
  const auto start = Clock::now();
  const int m = microbatches_;
  State state;
  auto split = [&](const at::Tensor& batch, const char* what) {
    TANDEM_CHECK(batch.defined(), "pp: stage ", stages_.front()->index(), " needs the ", what);
    TANDEM_CHECK(batch.dim() > 0 && batch.size(0) >= m, "pp: a batch of ", batch.dim() > 0 ? batch.size(0) : 0, " in ",
                 m, " microbatches: each needs at least one sample");
    return at::tensor_split(batch, m, 0);
  };
  if (stages_.front()->is_first()) state.xs = split(inputs, "inputs (the first stage reads them)");
  if (stages_.back()->is_last()) {
    state.ys = split(targets, "targets (the last stage reads them)");
    state.total = targets.size(0);
  }
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
  for (const Action& a : actions_) {
    // A failure names the stage, the action and the microbatch, led by the pipeline's first
    // failure (Note [The first failed stage] in stage.cpp); the launcher stops the other stages.
    try {
      run(a, state);
    } catch (const std::exception& e) {
      throw Error(stage(a.stage).explain_failure(
          "pp: stage " + std::to_string(a.stage) + " failed in the " +
          (a.kind == ActionKind::Forward ? "forward" : "backward") + " of microbatch " + std::to_string(a.microbatch) +
          ": " + one_line(e)));
    }
  }
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
  if (stages_.front()->is_first()) {
    TANDEM_CHECK(inputs.defined() && inputs.dim() > 0 && inputs.size(0) >= m, "pp: evaluate needs a batch of at least ",
                 m, " samples on the first stage (one per microbatch)");
    state.xs = at::tensor_split(inputs, m, 0);
  }
  for (const Action& a : actions_) {
    if (a.kind != ActionKind::Forward) continue;
    Stage& st = stage(a.stage);
    try {
      at::Tensor y = st.forward(input_of(a, state));
      if (st.is_last()) {
        outputs.push_back(y);
      } else {
        pass_on(a, y, state);
      }
    } catch (const std::exception& e) {
      throw Error(st.explain_failure("pp: stage " + std::to_string(a.stage) + " failed in the evaluation of microbatch " +
                                     std::to_string(a.microbatch) + ": " + one_line(e)));
    }
  }
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

at::Tensor Schedule::blocked(State& state, const std::function<at::Tensor()>& receive) {
  const auto start = Clock::now();
  at::Tensor t = receive();
  state.blocked_seconds += seconds_since(start);
  return t;
}

at::Tensor Schedule::input_of(const Action& a, State& state) {
  Stage& st = stage(a.stage);
  if (st.is_first()) return state.xs[static_cast<size_t>(a.microbatch)];
  if (holds(a.stage - 1)) return take(state.activations, a);
  // Note [Releasing sends] in stage.cpp: the previous stage has taken the gradients of the
  // backwards it ran before this forward.
  return blocked(state, [&] {
    at::Tensor received = st.recv_activation();
    st.release_gradient_sends_before(
        backwards_before_[static_cast<size_t>(a.stage / st.group().size())][static_cast<size_t>(a.microbatch)]);
    return received;
  });
}

void Schedule::pass_on(const Action& a, const at::Tensor& y, State& state) {
  if (holds(a.stage + 1)) {
    state.activations[a.stage + 1].push_back(y.detach().clone());  // a copy, as a message is
  } else {
    stage(a.stage).send_activation(y, a.microbatch);
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
      at::Tensor grad;
      if (holds(a.stage + 1)) {
        grad = take(state.gradients, a);
      } else {
        grad = blocked(state, [&] {
          at::Tensor received = st.recv_gradient(y);
          st.release_activation_send(a.microbatch);  // its gradient came back: it was taken
          return received;
        });
      }
      torch::autograd::backward({y}, {grad});
      state.out[k][i] = at::Tensor();
    }
    if (!st.is_first()) {
      const at::Tensor& x = state.in[k][i];
      const at::Tensor grad = x.grad().defined() ? x.grad() : at::zeros_like(x);
      if (holds(a.stage - 1)) {
        state.gradients[a.stage - 1].push_back(grad.clone());
      } else {
        st.send_gradient(grad, a.microbatch);
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
