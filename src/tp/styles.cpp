// The styles of tandem/tp/style.h: each cuts the wrapped module's parameters in place (set_data:
// the module's members, the Hookable's adopted names and anything holding the tensor see the
// piece) and moves inputs and outputs in the Hookable's hooks.
#include <set>

#include <ATen/ATen.h>

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "apply_style.h"
#include "tandem/error.h"
#include "tandem/nn/checkpoint.h"

namespace tandem::tp::detail {
namespace {

using Kind = Placement::Kind;


// A whole parameter that each rank's forward used on its part of the sequence only: its gradient
// is all-reduced over the group before it accumulates, so what DDP, FSDP or the optimizer see is
// the whole gradient, on every rank.
void sum_gradient_over(at::Tensor& param, const Group& group) {
  if (!param.requires_grad()) return;
  param.register_hook([group](const at::Tensor& grad) {  // once per backward, checkpointed or not
    at::Tensor sum = grad.contiguous().clone();
    group->all_reduce(sum);
    return sum;
  });
}

bool last_dim(const Placement& p) { return p.is_shard() && p.dim == -1; }

// Note [Checked before cut]: parallelize runs every style twice, first with `checking` on (the
// errors, nothing changed), then for real, so that a bad plan leaves the model as it was.
struct Applier {
  nn::HookableImpl& module;
  const std::string& name;
  const std::shared_ptr<Conversions>& conversions;
  bool checking;
  std::set<c10::TensorImpl*>& already_cut;
  std::map<std::string, Placement> cut;

  const Group& group() const { return conversions->group(); }

  // `param` (named `key` in the module) cut to this rank's chunk along `dim`, in place: a copy, so
  // that the whole tensor's storage is freed.
  void keep_chunk(at::Tensor& param, const std::string& key, int64_t dim, const std::string& what) {
    TANDEM_CHECK(param.size(dim) % group()->size() == 0, "tp: ", what, " of size ", param.size(dim),
                 " does not divide among the ", group()->size(), " ranks of the tensor-parallel group");
    TANDEM_CHECK(!already_cut.count(param.unsafeGetTensorImpl()), "tp: '", name, ".", key,
                 "' is a tensor the plan cuts already (a tied weight?): give tied modules one style, or untie them");
    cut[key] = Placement::shard(dim);
    if (checking) {
      already_cut.insert(param.unsafeGetTensorImpl());
      return;
    }
    at::NoGradGuard no_grad;
    param.mutable_grad().reset();  // a gradient of the whole shape would not add to the piece's
    param.set_data(chunk_along(param.detach(), dim, *group()).clone());
  }
  template <typename Hook>
  void pre(Hook hook) {
    if (!checking) module.add_forward_pre_hook(std::move(hook));
  }
  template <typename Hook>
  void post(Hook hook) {
    if (!checking) module.add_forward_hook(std::move(hook));
  }

  void operator()(const ColwiseParallel& s) {
    TANDEM_CHECK(s.output_layout().kind == Kind::Replicate || last_dim(s.output_layout()), "tp: '", name,
                 "': ColwiseParallel's output layout is Shard(-1) or Replicate(), not ", s.output_layout().str());
    auto conv = conversions;
    const std::string where = name;
    const Placement in = s.input_layout(), out = s.output_layout();
    if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(module.module())) {
      keep_chunk(linear->weight, "weight", 0, "'" + name + "' has " + std::to_string(linear->weight.size(0)) +
                                                  " output features, which as a ColwiseParallel dimension");
      if (linear->bias.defined()) keep_chunk(linear->bias, "bias", 0, "'" + name + "'s bias");
      pre([conv, where, in](size_t position, const at::Tensor& x) {
        return position == 0 ? conv->input(x, in, Placement::replicate(), where) : x;
      });
    } else if (auto embedding = std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(module.module())) {
      TANDEM_CHECK(!embedding->options.max_norm(), "tp: '", name,
                   "': ColwiseParallel on an Embedding with max_norm is not supported (each rank would renormalise by "
                   "its slice's norm)");
      keep_chunk(embedding->weight, "weight", 1, "'" + name + "' has an embedding dimension of " +
                                                     std::to_string(embedding->weight.size(1)) + ", which");
      pre([conv, where, in](size_t position, const at::Tensor& x) {
        return position == 0 ? conv->input(x, in, Placement::replicate(), where, /*differentiable=*/false) : x;
      });
    } else {
      TANDEM_CHECK(false, "tp: ColwiseParallel applies to Linear and Embedding; '", name, "' is ",
                   type_of(*module.module()));
    }
    post([conv, where, out](const at::Tensor& y) { return conv->output(y, Placement::shard(-1), out, where); });
  }

  void operator()(const RowwiseParallel& s) {
    const Placement out = s.output_layout();
    TANDEM_CHECK(out.kind == Kind::Replicate || (out.is_shard() && out.dim != -1), "tp: '", name,
                 "': RowwiseParallel's output layout is Replicate() or Shard(d) of a dimension other than the last, "
                 "not ", out.str());
    auto conv = conversions;
    const std::string where = name;
    if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(module.module())) {
      const Placement in = s.input_layout().value_or(Placement::shard(-1));
      keep_chunk(linear->weight, "weight", 1, "'" + name + "' has " + std::to_string(linear->weight.size(1)) +
                                                  " input features, which as a RowwiseParallel dimension");
      if (checking) return;
      // The bias is added once, to the reduced sum: Linear's forward runs without it (its member is
      // emptied; the parameter stays registered under its name) and the output hook adds it.
      at::Tensor bias = linear->bias;
      linear->bias = at::Tensor();
      if (bias.defined() && out.is_shard()) sum_gradient_over(bias, group());
      pre([conv, where, in](size_t position, const at::Tensor& x) {
        return position == 0 ? conv->input(x, in, Placement::shard(-1), where) : x;
      });
      post([conv, where, out, bias](const at::Tensor& y) {
        at::Tensor reduced = conv->output(y, Placement::partial(), out, where);
        TANDEM_CHECK(!out.is_shard() || (out.dim >= 0 ? out.dim : out.dim + reduced.dim()) != reduced.dim() - 1,
                     "tp: '", where, "': RowwiseParallel's output cannot be Shard of the last dimension (", out.str(),
                     " of a ", reduced.dim(), "-d output): the bias is whole");
        return bias.defined() ? reduced + bias.to(reduced.scalar_type()) : reduced;  // autocast's dtype, as Linear's
      });
    } else if (auto embedding = std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(module.module())) {
      const Placement in = s.input_layout().value_or(Placement::replicate());
      const auto& o = embedding->options;
      TANDEM_CHECK(!o.padding_idx() && !o.max_norm() && !o.scale_grad_by_freq(), "tp: '", name,
                   "': RowwiseParallel on an Embedding with padding_idx, max_norm or scale_grad_by_freq is not supported");
      const int64_t rows = embedding->weight.size(0);
      keep_chunk(embedding->weight, "weight", 0, "'" + name + "' has a vocabulary of " + std::to_string(rows) +
                                                     " tokens, which");
      if (checking) return;
      const int64_t each = rows / group()->size();
      const int64_t first = group()->rank() * each;
      // Tokens of other ranks' rows look up row 0 and are zeroed after: the sum over ranks is the lookup.
      auto outside = std::make_shared<at::Tensor>();
      pre([conv, where, in, first, each, rows, outside](size_t position, const at::Tensor& x) {
        if (position != 0) return x;
        at::Tensor tokens = conv->input(x, in, Placement::replicate(), where, /*differentiable=*/false);
        // Every rank holds the same tokens: each raises this, as Embedding would, or none does. On
        // CUDA as Embedding does there, a device-side assert: a forward must not wait for the host.
        const at::Tensor inside = ((tokens >= 0) & (tokens < rows)).all();
        const std::string bad = "tp: '" + where + "': a token id outside the vocabulary of " + std::to_string(rows);
        if (tokens.is_cuda()) {
          at::_assert_async(inside, bad);
        } else {
          TANDEM_CHECK(inside.item<bool>(), bad);
        }
        *outside = (tokens < first) | (tokens >= first + each);
        return (tokens - first).masked_fill(*outside, 0);
      });
      post([conv, where, out, outside](const at::Tensor& y) {
        at::Tensor partial = y.masked_fill(outside->unsqueeze(-1), 0);
        outside->reset();
        return conv->output(partial, Placement::partial(), out, where);
      });
    } else {
      TANDEM_CHECK(false, "tp: RowwiseParallel applies to Linear and Embedding; '", name, "' is ",
                   type_of(*module.module()));
    }
  }

  void operator()(const SequenceParallel& s) {
    (void)s;
    if (checking) return;
    for (auto& param : module.parameters()) sum_gradient_over(param, group());
  }

  void operator()(const PrepareModuleInput& s) {
    TANDEM_CHECK(s.input_layouts().size() == s.desired_input_layouts().size(), "tp: '", name,
                 "': PrepareModuleInput has ", s.input_layouts().size(), " input layouts and ",
                 s.desired_input_layouts().size(), " desired ones");
    for (const Placement& desired : s.desired_input_layouts()) {
      TANDEM_CHECK(desired.kind != Kind::Partial, "tp: '", name,
                   "': a desired input layout Partial(): a module takes Replicate() or Shard(d)");
    }
    auto conv = conversions;
    const std::string where = name;
    auto from = s.input_layouts(), to = s.desired_input_layouts();
    pre([conv, where, from, to](size_t position, const at::Tensor& x) {
      if (position >= from.size()) return x;
      const bool differentiable = at::isFloatingType(x.scalar_type()) || at::isComplexType(x.scalar_type());
      if (from[position] == to[position]) {
        if (from[position].kind == Kind::Replicate) conv->check_replicated(x, where);
        return x;
      }
      if (to[position].kind == Kind::Replicate && differentiable && from[position].kind != Kind::Partial) {
        // The module computes on the whole tensor and returns its whole gradient: each rank keeps its chunk.
        return gather_from(x, from[position].dim, conv->group());
      }
      return conv->input(x, from[position], to[position], where, differentiable);
    });
  }

  void operator()(const PrepareModuleOutput& s) {
    auto conv = conversions;
    const std::string where = name;
    const Placement from = s.output_layout(), to = s.desired_output_layout();
    post([conv, where, from, to](const at::Tensor& y) { return conv->output(y, from, to, where); });
  }
};

}  // namespace

std::string type_of(const torch::nn::Module& module) {
  std::string name = module.name();
  const std::string impl = "Impl";
  if (name.size() > impl.size() && name.compare(name.size() - impl.size(), impl.size(), impl) == 0) {
    name.resize(name.size() - impl.size());
  }
  return name;
}

std::map<std::string, Placement> apply_style(const Style& style, nn::HookableImpl& module, const std::string& name,
                                             const std::shared_ptr<Conversions>& conversions, bool checking,
                                             std::set<c10::TensorImpl*>& already_cut) {
  Applier applier{module, name, conversions, checking, already_cut, {}};
  std::visit(applier, style);
  return applier.cut;
}

}  // namespace tandem::tp::detail
