// Note [FSDP schedule]
// Units are the tandem::fsdp::Unit modules under the root, plus the root unit (the parameters of
// no unit, stored as one unit per child of the root). Each parameter belongs to the innermost
// unit around it (Note [Unit layout] for how it is stored). One training step:
// - root forward: gather the root unit (it is not freed after forward: FSDP2 does not reshard the
//   root after forward either); prefetch the first unit of the last step's order.
// - unit forward: wait for its gather (or gather now); prefetch the next unit in the order the last
//   step ran them; run it; free it (reshard_after_forward), unless it is the last unit of the
//   forward (the first of backward: it would be gathered again at once) or its output could not be
//   hooked (an opaque output type), in which case it stays gathered until its backward.
// - unit backward: a pre-hook on the autograd node of each of the unit's outputs runs before any
//   of the unit's backward: gather it again (or wait for its prefetch), prefetch the unit before it
//   in forward order. Autograd saved the parameter tensors themselves, whose data is gathered
//   again, so what backward reads is valid.
// - gradients: a post-hook on each parameter's AccumulateGrad counts the unit's gradients; once
//   all of a unit's have arrived, the unit is reduce-scattered (averaged, as DDP averages) while
//   backward goes on, the whole gradients are dropped, and the unit is freed (each child of the
//   root too: an output head's gradients go early in backward, not with the embedding's at the end).
// - HSDP: each unit's rows are all-reduced across the replicas while backward goes on (Note
//   [Replicas during backward]).
// - end of backward (one callback queued by the first hook): units some of whose parameters got
//   no gradient are reduce-scattered now (zeros for those), every reduce-scatter (and all-reduce
//   across the replicas) is waited for and added into the shards' gradients, every unit is freed.
// - a backward that raises (Note [Failed backward] in include/tandem/ddp/reducer.h): its end never
//   comes; the next forward finds it started, and the ranks agree on the collectives it launched
//   (Engine::State::catch_up) before its gathers and reduce-scatters are waited for and dropped.
// - no_sync (the forward decides, as in DDP): nothing is reduced; the whole gradients stay on the
//   parameters and accumulate, and the next synced backward reduce-scatters their sum: memory of
//   one whole gradient, as DDP's accumulation costs.
// Every rank must run the same units in the same order (the same graph), as in PyTorch's FSDP.
//
// Note [Several forwards in flight]
// A pipeline stage runs several forwards before their backwards (GPipe: all of a step's; 1F1B:
// up to P - s), all under no_sync, and arms only the last backward of the step to reduce-scatter
// (prepare_for_backward: as if its forward had been synced). Each backward is self-contained: it
// gathers each unit again in its pre-hook, the root's units too (a later forward's start or an
// earlier backward's end freed them), and ends by resharding everything; a forward that finds
// an earlier one's backward pending frees what it kept gathered (its backward gathers again).
// The armed backward reduce-scatters the whole gradients the step accumulated: one reduction per
// unit per step.
//
// Note [Replicas during backward]
// HSDP sums a unit's rows over its shard group (reduce-scatter) and then over the replicas
// (all-reduce of the rows). FSDP2 issues the all-reduce on each reduce-scatter's stream as soon as
// it is issued, so both overlap the rest of backward. On a CPU backend there is no stream to
// order them: when a unit's reduce-scatter starts, the all-reduces of the units whose
// reduce-scatters started before it are started (each waits for its reduce-scatter, issued a unit's
// backward ago, so mostly done). Every rank starts them in the same order, backward's; the last
// unit's goes at the end of backward. A failed backward launches the all-reduces too ("a3"): the
// catch-up runs over the shard group, then over the replicas (Engine::State::catch_up).
#include "tandem/fsdp/engine.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "common/host_buffer_pool.h"
#include "tandem/ddp/failed_backward.h"
#include "common/ready_hook.h"
#include "fsdp/unit_shard.h"
#include "tandem/comm/agreement.h"
#include "tandem/comm/device_mesh.h"
#include "tandem/error.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/fsdp/unit.h"
#include "tandem/host_allocator.h"
#include "tandem/nn/checkpoint_module.h"
#include "tandem/zero/clip_grad_norm.h"

namespace tandem::fsdp::detail {
namespace {

// Runs before an autograd node executes: a unit's backward is about to start.
class BeforeBackward : public torch::autograd::FunctionPreHook {
 public:
  BeforeBackward(std::weak_ptr<Engine> engine, size_t unit) : engine_(std::move(engine)), unit_(unit) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (auto engine = engine_.lock()) engine->pre_backward(unit_);
    return grads;
  }

 private:
  std::weak_ptr<Engine> engine_;
  size_t unit_;
};

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

struct Engine::State {
  std::shared_ptr<comm::ProcessGroup> pg;
  comm::ProcessGroup* replicas = nullptr;  // HSDP's replicate group (two or more), or null
  FullyShardOptions options;
  torch::nn::Module* root = nullptr;
  std::vector<std::unique_ptr<UnitShard>> units;  // the Unit modules' in tree order, then the root unit
  std::vector<UnitImpl*> modules;                 // the Unit modules (units.size() or one fewer)
  std::vector<size_t> root_units;                 // the root's parameters, per child of the root
  std::vector<at::TensorImpl*> identity;          // the root's parameters as wrapped, in order
  std::unordered_map<const at::TensorImpl*, std::pair<size_t, size_t>> where;  // parameter -> (unit, slot)
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;

  std::mutex mutex;
  bool sync = true;
  bool synced_forward = true;          // what the last forward decided for its backward
  std::vector<size_t> order, last_order;  // units as this forward and the last one ran them
  std::vector<bool> keep;              // not freed after forward (output not hookable)
  std::vector<int64_t> expected, ready;  // gradients per unit: needed, arrived in this backward
  int64_t peak_transient = 0;           // bytes (MemoryBytes::peak_transient)
  void note_peak() {
    int64_t now = 0;
    for (const auto& unit : units) now += unit->gathered_now_bytes() + unit->full_grad_bytes();
    peak_transient = std::max(peak_transient, now);
  }
  bool backward_started = false;
  bool backward_pending = false;       // a forward's outputs wait for their backward

  // Note [Failed backward]: the collectives this backward launched, in order ("g3": unit 3's
  // all-gather, "r3": its reduce-scatter, "a3": its all-reduce across the replicas), what the
  // ranks compare when it raises.
  std::vector<std::string> launched;
  std::vector<size_t> unchained;       // HSDP: reduce-scattered in this backward, not yet all-reduced
  int64_t instance = 0;                // this engine's number in the process, the same on every rank
  int failed_backwards = 0;
  void start_gather(size_t u) {
    UnitShard& unit = *units[u];
    if (unit.gathered() || unit.gathering()) return;
    unit.start_gather();
    if (backward_started) launched.push_back("g" + std::to_string(u));
  }
  void start_reduce(size_t u) {
    UnitShard& unit = *units[u];
    if (unit.reducing()) return;
    unit.start_reduce();
    if (backward_started && unit.reducing()) launched.push_back("r" + std::to_string(u));
    if (!replicas || !backward_started) return;
    for (size_t v : std::exchange(unchained, {})) {  // Note [Replicas during backward]
      if (units[v]->chain_replicas()) launched.push_back("a" + std::to_string(v));
    }
    if (unit.reducing()) unchained.push_back(u);
  }
  std::vector<std::string> catch_up(comm::ProcessGroup& group, const std::string& prefix,
                                    const std::vector<std::string>& mine);
};

// A backward that raised may have launched collectives on some ranks that others, raising earlier,
// never launched. Every rank posts the ones it launched; each launches what it lacks of the
// longest list, in its order, so that every collective started has its partners (the results go
// unused), as DDP's reducer launches the buckets it lacks. Ranks that raised at the same point lack
// nothing. Lists that are not one another's beginnings (the ranks ran different graphs) cannot be
// matched: every rank throws.
std::vector<std::string> Engine::State::catch_up(comm::ProcessGroup& group, const std::string& prefix,
                                                 const std::vector<std::string>& mine) {
  std::string post = std::to_string(mine.size());
  for (const auto& c : mine) post += " " + c;
  const auto posts = ddp::exchange_after_failed_backward(group, prefix, post, "fsdp");
  std::vector<std::vector<std::string>> lists;
  size_t longest = 0;
  for (const auto& p : posts) {
    std::istringstream in(p);
    size_t count = 0;
    in >> count;
    lists.emplace_back(count);
    for (auto& c : lists.back()) in >> c;
    if (lists.back().size() > lists[longest].size()) longest = lists.size() - 1;
  }
  for (size_t r = 0; r < lists.size(); ++r) {
    TANDEM_CHECK(std::equal(lists[r].begin(), lists[r].end(), lists[longest].begin()),
                 "fsdp: backward failed on every rank, but after other collectives on ", group.describe_rank(int(r)),
                 " than on ", group.describe_rank(int(longest)), " ('", posts[r], "' against '", posts[longest],
                 "'): the ranks ran different graphs, and their collectives are out of step");
  }
  for (size_t k = mine.size(); k < lists[longest].size(); ++k) {
    const std::string& c = lists[longest][k];
    UnitShard& unit = *units.at(std::stoul(c.substr(1)));
    if (c[0] == 'g') {
      unit.reshard();  // what it held came from collectives every rank launched
      unit.start_gather();
    } else if (c[0] == 'r') {
      unit.discard_reduce();
      unit.start_reduce();  // whatever gradients are here: nobody uses the result
    } else {
      unit.chain_replicas();
    }
  }
  return lists[longest];
}

Engine::Engine() : s_(std::make_unique<State>()) {}

Engine::~Engine() {
  for (size_t i = 0; i < s_->accumulators.size(); ++i) s_->accumulators[i]->del_post_hook(s_->hook_keys[i]);
}

std::pair<std::shared_ptr<comm::ProcessGroup>, FullyShardOptions> mesh_groups(const comm::DeviceMesh& mesh,
                                                                               FullyShardOptions options) {
  const auto names = mesh.names();
  TANDEM_CHECK(names.size() <= 2, "fsdp: a mesh of ", names.size(), " dimensions (", mesh.describe(),
               "); FSDP takes one (shard) or two (replicate, shard): pass mesh[{...}] of those");
  if (names.size() == 2) options.replicate_group(mesh.group(names[0]));
  return {mesh.group(names.back()), std::move(options)};
}

namespace {

// HSDP's two groups must be a mesh's two dimensions: every replica of this rank holds the same
// rows, so its rank in its own shard group is this rank's.
void check_replicas(comm::ProcessGroup& shard, comm::ProcessGroup& replicate) {
  const auto places = replicate.all_gather(at::tensor({int64_t{shard.rank()}, int64_t{shard.size()}}));
  for (int r = 0; r < replicate.size(); ++r) {
    const auto theirs = places[static_cast<size_t>(r)];
    TANDEM_CHECK(theirs[0].item<int64_t>() == shard.rank() && theirs[1].item<int64_t>() == shard.size(), "fsdp: ",
                 replicate.describe_rank(r), " of the replicate group is rank ", theirs[0].item<int64_t>(), " of ",
                 theirs[1].item<int64_t>(), " in its shard group, this process rank ", shard.rank(), " of ",
                 shard.size(), ": the groups must be two dimensions of one mesh ({\"replicate\", \"shard\"})");
  }
}

// Note [Checkpointed units]: a checkpointed unit recomputes its wrapped forward inside its own
// backward, where the engine has gathered it again (its BeforeBackward hook sits on the checkpoint's
// autograd node, whose backward is the recompute). A unit that would run inside a recompute (in a
// checkpointed unit, or in a tandem::nn::Checkpoint) would gather, hook and reshard itself inside the
// backward of another, out of the engine's order: refused.
void check_recomputes(torch::nn::Module& root) {
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    const auto* unit = dynamic_cast<UnitImpl*>(item.value().get());
    const bool recomputes = dynamic_cast<nn::CheckpointImpl*>(item.value().get()) || (unit && unit->activation_checkpointing());
    if (!recomputes) continue;
    for (const auto& inner : item.value()->named_modules(item.key(), /*include_self=*/false)) {
      TANDEM_CHECK(!dynamic_cast<UnitImpl*>(inner.value().get()), "fsdp: unit '", inner.key(), "' is inside '",
                   item.key(), "', which is checkpointed: checkpoint the inner units instead (a unit cannot run inside ",
                   "another's recompute)");
    }
  }
}

}  // namespace

std::shared_ptr<Engine> Engine::create(torch::nn::Module& root, std::shared_ptr<comm::ProcessGroup> pg,
                                       FullyShardOptions options) {
  tune_host_allocator(HostAllocatorPolicy::ReturnLarge);  // Note [Host allocator]: FSDP gives memory back
  const MixedPrecisionPolicy& policy = options.mixed_precision();
  for (const auto& dtype : {policy.param_dtype(), policy.reduce_dtype(), policy.output_dtype()}) {
    TANDEM_CHECK(!dtype || at::isFloatingType(*dtype), "fsdp: mixed precision needs floating-point dtypes, got ",
                 c10::toString(*dtype));
  }
  std::shared_ptr<Engine> engine(new Engine());
  State& s = *engine->s_;
  s.pg = std::move(pg);
  s.options = options;
  // Note [Agreement before waiting] (docs/design/comm.md): the same FSDP object, with the same
  // options, on every rank of the shard group, before anything waits on the others.
  s.instance = s.pg->count_object("fsdp");
  auto dtype_text = [](const std::optional<at::ScalarType>& d) { return d ? std::string(c10::toString(*d)) : "none"; };
  int64_t tensors = 0, values = 0;
  for (const auto& p : root.parameters()) {
    ++tensors;
    values += p.numel();
  }
  comm::Agreement("fsdp: the FullyShardedDataParallel being made")
      .field("FSDP objects made on this group before it", s.instance)
      .field("parameters", std::to_string(tensors) + " tensors of " + std::to_string(values) + " values")
      .field("reshard_after_forward", options.reshard_after_forward() ? "true" : "false")
      .field("prefetch", options.prefetch() ? "true" : "false")
      .field("sync_module_states", options.sync_module_states() ? "true" : "false")
      .field("mixed precision (param, reduce, output)", dtype_text(policy.param_dtype()) + ", " +
                                                           dtype_text(policy.reduce_dtype()) + ", " +
                                                           dtype_text(policy.output_dtype()))
      .field("replicate group size", options.replicate_group() ? options.replicate_group()->size() : 1)
      .field("auto wrap", options.auto_wrap() ? "set" : "none")
      .field("activation checkpointing", options.activation_checkpointing() ? "set" : "none")
      .check(*s.pg);
  // HSDP's replicas; a replicate group of one is plain FSDP.
  comm::ProcessGroup* replicas =
      options.replicate_group() && options.replicate_group()->size() > 1 ? options.replicate_group().get() : nullptr;
  if (replicas) check_replicas(*s.pg, *replicas);
  s.replicas = replicas;
  s.root = &root;

  // The units, each once.
  std::vector<std::pair<std::string, UnitImpl*>> found;
  std::unordered_map<UnitImpl*, std::string> seen;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    auto* unit = dynamic_cast<UnitImpl*>(item.value().get());
    if (!unit) continue;
    auto [it, fresh] = seen.emplace(unit, item.key());
    TANDEM_CHECK(fresh, "fsdp: unit '", it->second, "' is also at '", item.key(),
                 "': a module can be one unit, once");
    TANDEM_CHECK(!unit->attached(), "fsdp: unit '", item.key(), "' already belongs to another FullyShardedDataParallel");
    found.emplace_back(item.key(), unit);
  }
  check_recomputes(root);

  // Each parameter to the innermost unit whose path prefixes its name; a tensor reachable under
  // two names (a tied weight) must fall in one unit.
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> params(found.size() + 1);
  std::unordered_map<const at::TensorImpl*, std::pair<size_t, std::string>> owner;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    size_t best = found.size();  // the root unit
    size_t best_length = 0;
    for (size_t u = 0; u < found.size(); ++u) {
      const std::string& prefix = found[u].first;
      if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 && name[prefix.size()] == '.' &&
          prefix.size() + 1 > best_length) {
        best = u;
        best_length = prefix.size() + 1;
      }
    }
    const at::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    auto [it, fresh] = owner.emplace(impl, std::make_pair(best, name));
    if (!fresh) {
      const size_t other = it->second.first;
      TANDEM_CHECK(other == best, "fsdp: parameter '", it->second.second, "' is also '", name, "', in ",
                   other == found.size() ? "the root" : "unit '" + found[other].first + "'", " and in ",
                   best == found.size() ? "the root" : "unit '" + found[best].first + "'",
                   ": a parameter shared by two units must be in one (leave both modules to the root)");
      continue;
    }
    params[best].emplace_back(name, item.value());
    s.identity.push_back(item.value().unsafeGetTensorImpl());
  }

  // Rank 0's weights everywhere (before anything is cut), as DDP starts: a unit at a time, so the
  // coalesced copy is one unit's size, not the model's.
  // HSDP: across the replicas first (the shard group's rank 0 of each gets global rank 0's), then
  // within each shard group.
  std::vector<comm::ProcessGroup*> sync_over;
  if (replicas) sync_over.push_back(replicas);
  if (s.pg->size() > 1) sync_over.push_back(s.pg.get());
  if (options.sync_module_states()) {
    at::NoGradGuard no_grad;
    for (comm::ProcessGroup* group : sync_over) {
      for (const auto& unit_params : params) {
        std::vector<at::Tensor> state;
        for (const auto& item : unit_params) state.push_back(item.second.detach());
        if (!state.empty()) group->broadcast_coalesced(state, 0);
      }
      std::vector<at::Tensor> buffers;
      for (auto& b : root.buffers()) buffers.push_back(b);
      if (!buffers.empty()) group->broadcast_coalesced(buffers, 0);
    }
  }

  // The root unit's parameters are stored as one unit per child of the root (its own tensors in
  // one more): all of them are gathered for the whole step, but each child's gradients are
  // reduce-scattered, and its parameters freed, as soon as they are all in (an output head's
  // early in backward, an embedding's at the end), not when the last of the root's arrives.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>> groups;
  for (size_t u = 0; u < found.size(); ++u) groups.emplace_back(found[u].first, std::move(params[u]));
  const size_t first_root = groups.size();
  for (auto& item : params[found.size()]) {
    const auto dot = item.first.find('.');
    const std::string child = dot == std::string::npos ? "" : item.first.substr(0, dot);
    auto it = std::find_if(groups.begin() + static_cast<std::ptrdiff_t>(first_root), groups.end(),
                           [&](const auto& g) { return g.first == child; });
    if (it == groups.end()) it = groups.insert(groups.end(), {child, {}});
    it->second.push_back(std::move(item));
  }

  for (size_t u = 0; u < groups.size(); ++u) {
    if (u >= first_root) s.root_units.push_back(u);
    s.units.push_back(std::make_unique<UnitShard>(u >= first_root ? "(root) " + groups[u].first : groups[u].first,
                                                  std::move(groups[u].second), *s.pg,
                                                  replicas, policy));
    if (u < first_root) s.modules.push_back(found[u].second);
  }
  // The hooks while the parameters have their whole shape and their final dtype (Note [Unit
  // layout]): AccumulateGrad keeps the shape it is created with, and is forgotten on a dtype change.
  // Only once every unit is built: a unit that throws leaves every parameter as it was.
  for (size_t u = 0; u < s.units.size(); ++u) {
    s.units[u]->take_placeholders();
    for (const auto& slot : s.units[u]->slots()) {
      if (!slot.param.requires_grad()) continue;
      auto accumulator = torch::autograd::impl::grad_accumulator(slot.param);
      std::weak_ptr<Engine> weak = engine;
      s.hook_keys.push_back(accumulator->add_post_hook(std::make_unique<tandem::detail::ReadyHook>([weak, u] {
        if (auto e = weak.lock()) e->on_gradient(u);
      })));
      s.accumulators.push_back(std::move(accumulator));
    }
    s.units[u]->reshard();
  }
  for (size_t u = 0; u < s.units.size(); ++u) {
    for (size_t i = 0; i < s.units[u]->slots().size(); ++i) {
      s.where[s.units[u]->slots()[i].param.unsafeGetTensorImpl()] = {u, i};
    }
  }
  // Note [Host buffer pool]: free buffers kept for the next step, up to what a step holds at once:
  // the root gathered for the whole step; around the running unit its gathered storage, the next
  // one's with its all-gather's send and receive buffers, and the reduce-scatters in flight; and
  // every unit's reduced gradient rows, which live until zero_grad (the whole packed gradients in
  // a world of one, where they are the reduce's output).
  // In the pool's terms: whole pages, nothing for buffers too small to be pooled.
  // A unit's whole size is its gathered parameters' or its reduce-scatter's input, whichever is
  // larger (they differ under mixed precision).
  size_t root_bytes = 0, largest = 0, gradient_rows = 0;
  for (size_t u = 0; u < s.units.size(); ++u) {
    const UnitShard& unit = *s.units[u];
    const size_t reduced = static_cast<size_t>(unit.shard_numel()) * c10::elementSize(unit.reduce_dtype());
    const size_t whole = tandem::detail::pooled_bytes(
        std::max(static_cast<size_t>(unit.gathered_bytes()), reduced * static_cast<size_t>(s.pg->size())));
    if (u >= first_root) root_bytes += whole;
    largest = std::max(largest, whole);
    gradient_rows += tandem::detail::pooled_bytes(reduced);
  }
  tandem::detail::HostBufferPool::instance().keep_at_most(2 * root_bytes + 8 * largest + gradient_rows);
  s.keep.assign(s.units.size(), false);
  s.ready.assign(s.units.size(), 0);
  s.expected.assign(s.units.size(), 0);
  for (size_t u = 0; u < s.units.size(); ++u) {
    for (const auto& slot : s.units[u]->slots()) s.expected[u] += slot.param.requires_grad() ? 1 : 0;
  }
  for (size_t u = 0; u < found.size(); ++u) found[u].second->attach(engine, u);
  return engine;
}

void Engine::root_pre_forward() {
  State& s = *s_;
  // The parameters the units hold must be the module's, unchanged since wrapping.
  for (const auto& item : s.root->named_parameters(/*recurse=*/true)) {
    TANDEM_CHECK(s.where.count(item.value().unsafeGetTensorImpl()), "fsdp: parameter '", item.key(),
                 "' was replaced after sharding: change parameters before wrapping the model");
  }
  for (const auto& unit : s.units) {
    const std::string replaced = unit->replaced_parameter();
    TANDEM_CHECK(replaced.empty(), "fsdp: parameter '", replaced,
                 "' was replaced after sharding (its data changed): change parameters before wrapping the model");
    // The hooks and each unit's count of gradients were set at wrapping: a parameter unfrozen
    // since would never be reduced, one frozen since would hold its unit's reduction to the end.
    for (const auto& slot : unit->slots()) {
      TANDEM_CHECK(slot.param.requires_grad() == slot.shard.requires_grad(), "fsdp: parameter '", slot.name, "' was ",
                   slot.param.requires_grad() ? "unfrozen" : "frozen",
                   " after sharding: set requires_grad before wrapping the model");
    }
  }
  // A forward whose backward never ran (evaluation with grad mode on) or never ended (it threw).
  if (s.backward_pending || s.backward_started) abandon_backward();
  if (!s.order.empty()) s.last_order = s.order;
  s.order.clear();
  s.synced_forward = s.sync;
  for (size_t u : s.root_units) s.units[u]->start_gather();
  for (size_t u : s.root_units) s.units[u]->finish_gather();
  s.note_peak();
  if (s.options.prefetch() && !s.last_order.empty()) s.units[s.last_order.front()]->start_gather();
}

void Engine::abandon_backward() {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mutex);
  const bool started = s.backward_started;
  s.backward_started = s.backward_pending = false;
  std::fill(s.keep.begin(), s.keep.end(), false);
  std::vector<std::string> launched = std::exchange(s.launched, {});
  s.unchained.clear();
  if (started) {  // before anything it launched is waited for
    // Within the shard group, then across the replicas: after the first, every rank of a replica
    // holds the same list, so every rank of a replicate group sees the same lists and makes the same.
    const std::string prefix =
        "tandem/fsdp/" + std::to_string(s.instance) + "/failed/" + std::to_string(s.failed_backwards++) + "/";
    if (s.pg->size() > 1) launched = s.catch_up(*s.pg, prefix, launched);
    if (s.replicas) s.catch_up(*s.replicas, prefix + "replicas/", launched);
  }
  std::exception_ptr failure;
  for (auto& unit : s.units) {
    try {
      unit->discard_reduce();  // a half-finished step's gradients reach no shard
      if (started) {
        for (auto& slot : unit->slots()) slot.param.mutable_grad() = at::Tensor();
      }
      unit->reshard();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

void Engine::root_post_forward(const std::vector<at::Tensor>& outputs, bool complete) {
  State& s = *s_;
  bool hooked = false;
  if (at::GradMode::is_enabled()) {
    std::unordered_set<torch::autograd::Node*> done;
    for (const auto& out : outputs) {
      if (!out.defined() || !out.requires_grad() || !out.grad_fn()) continue;
      if (!done.insert(out.grad_fn().get()).second) continue;
      out.grad_fn()->add_pre_hook(std::make_unique<BeforeBackward>(weak_from_this(), s.units.size()));  // the root's
      hooked = true;
    }
  }
  // An output it could not look into may be backwarded: everything stays as it is until then (or
  // until the next forward).
  if (hooked || (!complete && at::GradMode::is_enabled())) {
    s.backward_pending = true;
  } else {
    for (auto& unit : s.units) unit->reshard();  // no backward follows this forward
  }
}

void Engine::unit_pre_forward(size_t unit) {
  State& s = *s_;
  // Note [Checkpointed units]: the wrap-time check sees the module tree; this one sees a unit called
  // from a checkpointed lambda that check_recomputes could not.
  TANDEM_CHECK(!nn::in_recompute(), "fsdp: unit '", s.units[unit]->name(), "' ran inside an activation "
               "checkpoint's recompute: checkpoint the inner units instead (a unit cannot run inside a recompute)");
  s.order.push_back(unit);
  s.units[unit]->finish_gather();
  s.note_peak();
  // The next unit of the last step's order, if this step has followed it so far.
  const size_t k = s.order.size();
  if (s.options.prefetch() && k < s.last_order.size() && s.last_order[k - 1] == unit) {
    s.units[s.last_order[k]]->start_gather();
  }
}

void Engine::unit_post_forward(size_t unit, const std::vector<at::Tensor>& outputs, bool complete) {
  State& s = *s_;
  bool needs_backward = false, hookable = complete;
  if (at::GradMode::is_enabled()) {
    std::unordered_set<torch::autograd::Node*> done;
    for (const auto& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      needs_backward = true;
      if (!out.grad_fn()) {
        hookable = false;
        continue;
      }
      if (done.insert(out.grad_fn().get()).second) {
        out.grad_fn()->add_pre_hook(std::make_unique<BeforeBackward>(weak_from_this(), unit));
      }
    }
    if (!complete) needs_backward = true;  // an output we could not look into may need it
  }
  if (needs_backward && !hookable) s.keep[unit] = true;
  // The last unit of the forward is the first of backward: freeing it would only gather it again
  // (the peak is the same either way). Known from the last step's order.
  const bool last = !s.last_order.empty() && s.order.size() == s.last_order.size() && s.last_order.back() == unit;
  if (s.options.reshard_after_forward() && !s.keep[unit] && !(last && needs_backward)) s.units[unit]->reshard();
}

void Engine::forward_failed(std::exception_ptr error) {
  State& s = *s_;
  std::string at_rest;
  for (size_t u = 0; u < s.modules.size(); ++u) {
    if (!s.units[u]->gathered()) at_rest += (at_rest.empty() ? "'" : ", '") + s.units[u]->name() + "'";
  }
  // Nothing of this forward will be backwarded: free what it gathered.
  s.backward_pending = false;
  for (auto& unit : s.units) {
    if (unit->gathering()) unit->finish_gather();
    unit->reshard();
  }
  try {
    std::rethrow_exception(error);
  } catch (const tandem::Error&) {
    throw;
  } catch (const std::exception& e) {
    if (at_rest.empty()) throw;
    throw tandem::Error("fsdp: the forward failed: " + first_line(e.what()) + " (units " + at_rest +
                        " held no parameters then; a module inside a unit called directly, not through its "
                        "tandem::fsdp::Unit, fails like this)");
  }
}

bool Engine::sync() const { return s_->sync; }
void Engine::set_sync(bool enabled) { s_->sync = enabled; }
void Engine::prepare_for_backward() {
  std::lock_guard<std::mutex> lock(s_->mutex);
  s_->synced_forward = true;
}

void Engine::pre_backward(size_t unit) {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.backward_started) {
    s.backward_started = true;
    s.launched.clear();
    std::fill(s.ready.begin(), s.ready.end(), 0);
    std::weak_ptr<Engine> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto e = weak.lock()) e->end_of_backward();
    });
  }
  const bool root = unit >= s.units.size();
  if (!root) {
    s.start_gather(unit);
    s.units[unit]->finish_gather();
  } else {
    // Gathered since the forward, unless another forward or backward ran since (Note [Several
    // forwards in flight]); then gathered again now.
    for (size_t u : s.root_units) s.start_gather(u);
    for (size_t u : s.root_units) s.units[u]->finish_gather();
  }
  s.note_peak();
  if (!s.options.prefetch()) return;
  if (root) {  // backward starts with the last unit of the forward
    if (!s.order.empty()) s.start_gather(s.order.back());
    return;
  }
  // The unit before this one in forward order runs next in backward.
  for (size_t k = s.order.size(); k-- > 0;) {
    if (s.order[k] != unit) continue;
    if (k > 0) s.start_gather(s.order[k - 1]);
    break;
  }
}

void Engine::on_gradient(size_t unit) {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.backward_started) return;  // a backward that did not start from this model's output
  if (++s.ready[unit] != s.expected[unit]) return;
  s.note_peak();
  if (s.synced_forward) {
    s.start_reduce(unit);
  } else {
    s.units[unit]->upcast_full_gradients();  // accumulated in the reduce dtype
  }
  s.units[unit]->reshard();  // its backward is over: every gradient of it is in
}

void Engine::end_of_backward() {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mutex);
  const bool synced = s.synced_forward && s.backward_started;
  s.note_peak();
  s.backward_started = s.backward_pending = false;
  std::fill(s.keep.begin(), s.keep.end(), false);
  s.unchained.clear();  // their all-reduces start in finish_reduce, in unit order on every rank
  std::exception_ptr failure;
  for (size_t u = 0; u < s.units.size(); ++u) {
    try {
      if (synced && s.expected[u] > 0 && s.ready[u] != s.expected[u]) s.units[u]->start_reduce();
      if (!synced) s.units[u]->upcast_full_gradients();  // a unit some of whose parameters got none
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  for (auto& unit : s.units) {
    try {
      if (unit->gathering()) unit->finish_gather();
      unit->finish_reduce();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    unit->reshard();
  }
  if (failure) std::rethrow_exception(failure);
}

std::vector<std::pair<std::string, at::Tensor>> Engine::named_shards() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto* impl : s_->identity) {
    const auto [u, i] = s_->where.at(impl);
    const auto& slot = s_->units[u]->slots()[i];
    out.emplace_back(slot.name, slot.shard);
  }
  return out;
}

at::Tensor Engine::shard_of(const at::Tensor& parameter) const {
  auto it = s_->where.find(parameter.unsafeGetTensorImpl());
  if (it == s_->where.end()) return {};
  return s_->units[it->second.first]->slots()[it->second.second].shard;
}

std::optional<ShardSpec> Engine::spec_of(const at::Tensor& parameter) const {
  auto it = s_->where.find(parameter.unsafeGetTensorImpl());
  if (it == s_->where.end()) return std::nullopt;
  const auto& slot = s_->units[it->second.first]->slots()[it->second.second];
  return ShardSpec{slot.cut.shape, slot.cut.rows, slot.cut.row_numel, slot.cut.chunk_rows(),
                   slot.cut.first_row(s_->pg->rank()), slot.owned_rows};
}

void Engine::load_shards(const std::vector<std::pair<std::string, at::Tensor>>& rows) {
  std::unordered_map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : rows) by_name[name] = &t;
  TANDEM_CHECK(!s_->backward_started, "fsdp: load parameters between steps, not during a backward");
  if (s_->backward_pending) abandon_backward();  // a forward nobody backwarded: its units are freed
  at::NoGradGuard no_grad;
  for (auto& unit : s_->units) {
    unit->reshard();  // the next forward gathers what is loaded
    for (auto& slot : unit->slots()) {
      auto it = by_name.find(slot.name);
      if (it == by_name.end() || slot.owned_rows == 0) continue;
      slot.shard.view({slot.owned_rows, slot.cut.row_numel})
          .copy_(it->second->reshape({slot.owned_rows, slot.cut.row_numel}));
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> Engine::gather_parameters() {
  State& s = *s_;
  // From the shards, not the gathered parameters: those may be in a lower precision.
  std::map<const at::TensorImpl*, at::Tensor> whole;
  for (auto& unit : s.units) {
    auto tensors = unit->whole_parameters();
    for (size_t i = 0; i < tensors.size(); ++i) whole[unit->slots()[i].param.unsafeGetTensorImpl()] = tensors[i];
  }
  // Every name, a tied weight's second one too, as the module's named_parameters lists them (DDP's
  // checkpoints hold both).
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : s.root->named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), whole.at(item.value().unsafeGetTensorImpl()));
  }
  return out;
}

double Engine::clip_grad_norm(double max_norm, double norm_type) {
  std::vector<at::Tensor> all;
  for (const auto& unit : s_->units) {
    for (const auto& slot : unit->slots()) all.push_back(slot.param);
  }
  return clip_grad_norm(all, max_norm, norm_type);
}

double Engine::clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  zero::GradientPieces pieces;
  pieces.cut = true;
  for (const auto& p : parameters) {
    const at::Tensor shard = shard_of(p);
    TANDEM_CHECK(shard.defined(), "fsdp: clip_grad_norm was given a tensor of shape ", p.sizes(),
                 " that is no parameter of the sharded model");
    pieces.add(shard.grad(), true, shard);
  }
  return zero::clip_grad_norm(pieces, s_->pg.get(), max_norm, norm_type);
}

void Engine::reset_peak() { s_->peak_transient = 0; }

// Note [Exposed communication]
// Every gather and reduce-scatter is asynchronous; the host blocks only where it needs the result:
// a unit's gather before its forward or backward (a prefetch that has not arrived yet), and the
// reduce-scatters still in flight at the end of backward. The time blocked there is the
// communication the schedule did not hide behind compute, the figure `tandem bench` reports for
// FSDP next to its phases. It does not count compute slowed by collectives sharing its cores
// (on CPU, Gloo's threads run on the same cores), which shows only in the step time. On Gloo a
// reduce-scatter's wait also adds up the received slices (Note [Gloo reduce-scatter]): that sum
// is counted as communication, as c10d's own would be.
CommWaits Engine::comm_waits() const {
  CommWaits w;
  for (const auto& unit : s_->units) {
    w.all_gather_s += unit->gather_wait_seconds();
    w.reduce_scatter_s += unit->reduce_wait_seconds();
  }
  return w;
}

MemoryBytes Engine::memory() const {
  MemoryBytes m;
  m.peak_transient = s_->peak_transient;
  std::vector<int64_t> sizes;
  for (const auto& unit : s_->units) sizes.push_back(unit->gathered_bytes());
  std::sort(sizes.rbegin(), sizes.rend());
  for (size_t i = 0; i < sizes.size() && i < 2; ++i) m.two_largest_units += sizes[i];
  for (const auto& unit : s_->units) {
    m.parameter_shards += unit->shard_bytes();
    m.gathered += unit->gathered_now_bytes();
    m.full_gradients += unit->full_grad_bytes();
    m.gradient_shards += unit->shard_grad_bytes();
  }
  return m;
}

std::vector<UnitInfo> Engine::units() const {
  std::vector<UnitInfo> out;
  for (const auto& unit : s_->units) {
    out.push_back({unit->name(), unit->unsharded_numel(), unit->shard_numel(), unit->gathers()});
  }
  return out;
}

const std::shared_ptr<comm::ProcessGroup>& Engine::process_group() const { return s_->pg; }

std::optional<at::ScalarType> Engine::input_dtype() const {
  const MixedPrecisionPolicy& policy = s_->options.mixed_precision();
  return policy.cast_forward_inputs() ? policy.param_dtype() : std::nullopt;
}

std::optional<at::ScalarType> Engine::output_dtype() const { return s_->options.mixed_precision().output_dtype(); }

void unit_pre_forward(Engine& engine, size_t unit) { engine.unit_pre_forward(unit); }
std::optional<at::ScalarType> input_dtype(const Engine& engine) { return engine.input_dtype(); }
std::optional<at::ScalarType> output_dtype(const Engine& engine) { return engine.output_dtype(); }
void unit_post_forward(Engine& engine, size_t unit, const std::vector<at::Tensor>& outputs, bool complete) {
  engine.unit_post_forward(unit, outputs, complete);
}

}  // namespace tandem::fsdp::detail
