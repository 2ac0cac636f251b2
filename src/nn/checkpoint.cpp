// Note [Checkpoint node]
// A checkpointed segment is one custom autograd node (torch::autograd::Function) whose inputs are
// the segment's tensor arguments *and* the parameters it reads, and whose outputs are the segment's.
// - forward: Function::apply runs it under no_grad, so nothing inside keeps an activation; the
//   node saves the tensor inputs (as saved variables: an input changed in place before backward
//   is an error, as for any op), the RNG and autocast states, and the outputs' shapes.
// - backward: restore the forward's RNG and autocast states (the generators' own are put back
//   after, PyTorch's fork_rng), run the segment again with grad mode on over detached copies of
//   the inputs, then torch::autograd::grad of the recomputed outputs with respect to those copies
//   and the parameters. The node returns those gradients; the engine delivers the parameters' to
//   their AccumulateGrad nodes as it would any op's.
// Why the parameters are the node's inputs (and not only the arguments, as PyTorch's reentrant
// checkpoint has it): the node then requires grad when only the parameters do (the classic pitfall
// of reentrant checkpointing: with no input requiring grad, its output would not, and the
// parameters got nothing); DDP's find_unused_parameters, which walks the graph from the outputs,
// finds them behind the node; and their gradients leave the inner grad() as return values, so
// their AccumulateGrad post-hooks (DDP's reducer, FSDP's engine) run once, in the outer backward,
// not in the nested one. PyTorch's non-reentrant checkpoint gets the same from saved-tensor hooks,
// which LibTorch exposes only to Python.
//
// Note [Parameter hooks once]
// The inner grad() takes a parameter's gradient at its leaf, and the engine runs a leaf's tensor
// hooks (Tensor::register_hook) when it captures a gradient there, then once more when the outer
// backward accumulates what the node returned: a hook would see every gradient twice (TP's
// all-reduce would sum it twice). The parameters' tensor hooks are held aside for the inner grad()
// and put back after (hooks the recompute registered are kept, behind them), so they run once,
// in the outer backward, with the gradient the node returns, as under torch.utils.checkpoint.
#include "tandem/nn/checkpoint.h"

#include <sstream>
#include <unordered_set>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "common/scope_exit.h"
#include "nn/forward_state.h"
#include "tandem/error.h"

namespace tandem::nn::detail {
namespace {

thread_local int recompute_depth = 0;

// The leaves that require grad which the recomputed graph reaches (their AccumulateGrad nodes)
// short of the targets' own nodes: tensors the segment read without naming them, whose gradients
// it would lose. The walk stays inside the segment's graph unless such a tensor leads out of it.
std::vector<at::Tensor> unnamed_leaves(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& targets) {
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& t : targets) seen.insert(torch::autograd::impl::gradient_edge(t).function.get());
  std::vector<torch::autograd::Node*> stack;
  for (const auto& r : roots) {
    if (auto fn = r.grad_fn(); fn && seen.insert(fn.get()).second) stack.push_back(fn.get());
  }
  std::vector<at::Tensor> unnamed;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      unnamed.push_back(leaf->variable);
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function && seen.insert(edge.function.get()).second) stack.push_back(edge.function.get());
    }
  }
  return unnamed;
}

std::string shapes(const std::vector<std::vector<int64_t>>& sizes) {
  std::ostringstream out;
  for (size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << c10::IntArrayRef(sizes[i]);
  return out.str();
}

// Note [Parameter hooks once]: the tensors' hooks, held aside while alive.
class HooksHeldAside {
 public:
  explicit HooksHeldAside(const std::vector<at::Tensor>& tensors) {
    for (const auto& t : tensors) {
      if (!t.requires_grad() || !t.is_leaf()) continue;
      auto& hooks = torch::autograd::impl::hooks(t);
      if (hooks.empty()) continue;
      held_.emplace_back(t, std::move(hooks));
      hooks.clear();
    }
  }
  ~HooksHeldAside() {
    for (auto& [tensor, hooks] : held_) {
      auto& now = torch::autograd::impl::hooks(tensor);
      for (auto& added : now) hooks.push_back(std::move(added));
      now = std::move(hooks);
    }
  }
  HooksHeldAside(const HooksHeldAside&) = delete;
  HooksHeldAside& operator=(const HooksHeldAside&) = delete;

 private:
  std::vector<std::pair<at::Tensor, std::vector<std::unique_ptr<torch::autograd::FunctionPreHook>>>> held_;
};

// Everything the backward needs that is not a saved variable.
struct Segment : torch::CustomClassHolder {
  SegmentFunction run;
  size_t input_count = 0;              // the node's first inputs; the parameters follow
  std::vector<bool> input_requires_grad;
  std::vector<at::Tensor> parameters;
  bool preserve_rng_state = true;
  std::vector<c10::DeviceIndex> devices;  // CUDA devices whose generators are saved
  std::optional<RngStates> rng;
  AutocastState autocast;
  std::vector<std::vector<int64_t>> output_sizes;
  std::vector<bool> differentiable;    // per output: floating point, so it may carry a gradient
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList tensors,
                                                c10::intrusive_ptr<Segment> segment) {
    const std::vector<at::Tensor> inputs(tensors.begin(), tensors.begin() + segment->input_count);
    segment->devices = cuda_devices(tensors.vec());  // the inputs' and the parameters'
    if (segment->preserve_rng_state) segment->rng = RngStates::capture(segment->devices);
    segment->autocast = AutocastState::capture();
    std::vector<at::Tensor> outputs = segment->run(inputs);  // grad mode is off here (Function::apply)
    std::vector<at::Tensor> non_differentiable;
    for (size_t i = 0; i < outputs.size(); ++i) {
      TANDEM_CHECK(outputs[i].defined(), "checkpoint: output ", i,
                   " of the checkpointed function is an undefined tensor: return defined tensors only");
      segment->output_sizes.push_back(outputs[i].sizes().vec());
      const bool floating = at::isFloatingType(outputs[i].scalar_type()) || at::isComplexType(outputs[i].scalar_type());
      segment->differentiable.push_back(floating);
      if (!floating) non_differentiable.push_back(outputs[i]);
    }
    if (!non_differentiable.empty()) ctx->mark_non_differentiable(non_differentiable);
    ctx->save_for_backward(inputs);
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto segment = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    TANDEM_CHECK(!at::GradMode::is_enabled(), "checkpoint: backward with create_graph=true (a double backward) "
                 "through a checkpointed segment is not supported: take higher-order gradients without checkpointing");
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor copy = saved[i].detach();
      if (segment->input_requires_grad[i]) copy.requires_grad_(true);
      inputs.push_back(std::move(copy));
    }

    std::vector<at::Tensor> outputs;
    {
      // The generators go on afterwards as if the recompute had not run (PyTorch's fork_rng).
      std::optional<RngStates> after;
      if (segment->rng) {
        after = RngStates::capture(segment->devices);
        segment->rng->restore();
      }
      ScopeExit put_back([&after] {
        if (after) after->restore();
      });
      AutocastGuard autocast(segment->autocast);
      at::AutoGradMode grad(true);
      ++recompute_depth;
      ScopeExit leave([] { --recompute_depth; });
      outputs = segment->run(inputs);
    }

    std::vector<std::vector<int64_t>> sizes;
    for (const auto& out : outputs) sizes.push_back(out.defined() ? out.sizes().vec() : std::vector<int64_t>{});
    TANDEM_CHECK(sizes == segment->output_sizes, "checkpoint: the recompute in backward returned tensors of shapes [",
                 shapes(sizes), "] where the forward returned [", shapes(segment->output_sizes),
                 "]: a checkpointed function must compute the same again (no state that changes between its calls)");

    // The gradients of the outputs that carry one, with respect to the inputs and parameters that need one.
    std::vector<at::Tensor> roots, root_grads, targets;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!segment->differentiable[i] || !outputs[i].requires_grad() || !grad_outputs[i].defined()) continue;
      roots.push_back(outputs[i]);
      root_grads.push_back(grad_outputs[i]);
    }
    std::vector<size_t> target_of;  // node input -> index in targets, or npos
    for (const auto& in : inputs) {
      target_of.push_back(in.requires_grad() ? targets.size() : std::string::npos);
      if (in.requires_grad()) targets.push_back(in);
    }
    for (const auto& p : segment->parameters) {
      target_of.push_back(p.requires_grad() ? targets.size() : std::string::npos);
      if (p.requires_grad()) targets.push_back(p);
    }
    const auto unnamed = unnamed_leaves(roots, targets);
    TANDEM_CHECK(unnamed.empty(), "checkpoint: the checkpointed function read ", unnamed.size(),
                 " tensor(s) requiring grad that are neither its arguments nor in CheckpointOptions::parameters (the "
                 "first of shape ", unnamed.empty() ? c10::IntArrayRef() : unnamed.front().sizes(),
                 "): their gradients would be lost; pass them as arguments or list them in the options");
    torch::autograd::variable_list grads;
    if (!roots.empty() && !targets.empty()) {
      HooksHeldAside once(segment->parameters);
      grads = torch::autograd::grad(roots, targets, root_grads, /*retain_graph=*/false, /*create_graph=*/false,
                                    /*allow_unused=*/true);
    }
    torch::autograd::variable_list result;
    for (size_t t : target_of) result.push_back(t == std::string::npos || grads.empty() ? at::Tensor() : grads[t]);
    result.emplace_back();  // the segment argument
    return result;
  }
};

}  // namespace

}  // namespace tandem::nn::detail

namespace tandem::nn {
bool in_recompute() { return detail::recompute_depth > 0; }
}  // namespace tandem::nn

namespace tandem::nn::detail {

bool needs_checkpoint(const std::vector<at::Tensor>& inputs, const CheckpointOptions& options) {
  if (!at::GradMode::is_enabled()) return false;
  for (const auto& t : inputs) {
    if (t.requires_grad()) return true;
  }
  for (const auto& p : options.parameters()) {
    if (p.defined() && p.requires_grad()) return true;
  }
  return false;
}

std::vector<at::Tensor> checkpoint_tensors(SegmentFunction run, const std::vector<at::Tensor>& inputs,
                                           const CheckpointOptions& options) {
  auto segment = c10::make_intrusive<Segment>();
  segment->run = std::move(run);
  segment->input_count = inputs.size();
  segment->preserve_rng_state = options.preserve_rng_state();
  std::vector<at::Tensor> tensors = inputs;
  for (const auto& t : inputs) segment->input_requires_grad.push_back(t.requires_grad());
  // Each parameter once: a tied weight listed twice would otherwise be a node input twice, and its
  // gradient delivered (accumulated) twice.
  std::unordered_set<c10::TensorImpl*> listed;
  for (size_t i = 0; i < options.parameters().size(); ++i) {
    const at::Tensor& p = options.parameters()[i];
    TANDEM_CHECK(p.defined(), "checkpoint: parameter ", i, " of CheckpointOptions::parameters is an undefined tensor");
    if (!listed.insert(p.unsafeGetTensorImpl()).second) continue;
    segment->parameters.push_back(p);
    tensors.push_back(p);
  }
  return CheckpointFunction::apply(at::TensorList(tensors), segment);
}

}  // namespace tandem::nn::detail
