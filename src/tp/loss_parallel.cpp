// Note [Vocab-parallel cross entropy]: for each row, loss = log(sum_j exp(x_j - m)) - (x_t - m)
// with m the row's maximum over all classes. Every rank computes its part of max, sum and the
// target's logit; three all-reduces (max, then sums) make them whole. The gradient,
// softmax(x) - onehot(t), is local: each rank keeps its classes' softmax, computed in forward.
#include "tandem/tp/loss_parallel.h"

#include <limits>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "tandem/error.h"

namespace tandem::tp {
namespace {

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            Group group, CrossEntropyOptions options) {
    const int64_t classes = logits.size(-1);
    const int64_t first = static_cast<int64_t>(group->rank()) * classes;
    const int64_t total = classes * group->size();
    const at::ScalarType out_dtype = logits.scalar_type();
    const bool reduced = out_dtype == at::kHalf || out_dtype == at::kBFloat16;
    at::Tensor x = logits.reshape({-1, classes});
    if (reduced) x = x.to(at::kFloat);
    const at::Tensor t = target.reshape({-1});

    const at::Tensor valid = t != options.ignore_index();
    const at::Tensor out_of_range = valid & ((t < 0) | (t >= total));
    // On CUDA the checks below are device-side asserts (no host sync per call, as PyTorch's own
    // cross_entropy checks its targets there); on the CPU the exact one-line errors.
    const bool cuda = logits.is_cuda();
    const at::Tensor bad_flag = out_of_range.any();
    const bool bad_here = cuda ? false : bad_flag.item<bool>();
    const at::Tensor mine = valid & (t >= first) & (t < first + classes);
    const at::Tensor local_target = (t - first).masked_fill(~mine, 0);

    // The row maxima, and whether any rank found a bad target (every rank raises, none waits).
    at::Tensor max_and_flag = at::cat({std::get<0>(x.max(1)), bad_flag.to(x.scalar_type()).view({1})});
    group->all_reduce(max_and_flag, comm::ReduceOp::Max);
    if (cuda) {
      at::_assert_async(max_and_flag[-1] == 0, "tp: cross_entropy: a target is outside the " + std::to_string(total) +
                                                    " classes of the sharded logits on a rank of the group");
    }
    TANDEM_CHECK(!bad_here, "tp: cross_entropy: a target (", t.masked_select(out_of_range)[0].item<int64_t>(),
                 ") is outside the ", total, " classes of the sharded logits (", classes, " on each of ",
                 group->size(), " ranks)");
    TANDEM_CHECK(cuda || max_and_flag[-1].item<double>() == 0, "tp: cross_entropy: another rank of the group has a target "
                 "outside the ", total, " classes: the targets must be the same on every rank of the group");
    at::Tensor max = max_and_flag.narrow(0, 0, x.size(0));
    at::Tensor shifted = x - max.unsqueeze(1);
    at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(1);
    at::Tensor picked = shifted.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(~mine, 0);
    // One all-reduce for both sums: [rows, 2].
    at::Tensor sums = at::stack({sum_exp, picked}, 1).contiguous();
    group->all_reduce(sums, comm::ReduceOp::Sum);
    sum_exp = sums.select(1, 0);
    picked = sums.select(1, 1);

    at::Tensor loss = (sum_exp.log() - picked).masked_fill(~valid, 0);
    const at::Tensor count = valid.sum().to(loss.scalar_type());
    at::Tensor out;
    switch (options.reduction()) {
      case at::Reduction::None:
        out = loss.view(target.sizes());
        break;
      case at::Reduction::Sum:
        out = loss.sum();
        break;
      default:  // Mean
        out = loss.sum() / count;
        break;
    }
    ctx->saved_data["reduction"] = static_cast<int64_t>(options.reduction());
    ctx->saved_data["dtype"] = static_cast<int64_t>(out_dtype);
    ctx->saved_data["shape"] = logits.sizes().vec();
    ctx->save_for_backward({exp.div_(sum_exp.unsqueeze(1)), local_target, mine, valid, count});
    return out.to(out_dtype);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &softmax = saved[0], &local_target = saved[1], &mine = saved[2], &valid = saved[3],
                     &count = saved[4];
    const auto reduction = static_cast<at::Reduction::Reduction>(ctx->saved_data["reduction"].toInt());
    at::Tensor g = grads[0].to(softmax.scalar_type());
    at::Tensor per_row;  // d loss / d (row's loss)
    switch (reduction) {
      case at::Reduction::None:
        per_row = g.reshape({-1});
        break;
      case at::Reduction::Sum:
        per_row = g.expand({softmax.size(0)});
        break;
      default:  // Mean
        per_row = (g / count).expand({softmax.size(0)});
        break;
    }
    per_row = per_row.masked_fill(~valid, 0);
    at::Tensor grad = softmax * per_row.unsqueeze(1);
    // The target's own class: softmax - 1, on the rank that holds it.
    grad.scatter_add_(1, local_target.unsqueeze(1), (-per_row * mine.to(per_row.scalar_type())).unsqueeze(1));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    grad = grad.view(ctx->saved_data["shape"].toIntVector()).to(dtype);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor cross_entropy(const at::Tensor& local_logits, const at::Tensor& target, const Group& group,
                         const CrossEntropyOptions& options) {
  TANDEM_CHECK(group, "tp: cross_entropy: no process group");
  TANDEM_CHECK(local_logits.dim() >= 1 && local_logits.size(-1) > 0,
               "tp: cross_entropy: the logits need a class dimension (the last), of at least one class");
  TANDEM_CHECK(at::isFloatingType(local_logits.scalar_type()), "tp: cross_entropy: logits of dtype ",
               local_logits.scalar_type(), ", not a floating type");
  TANDEM_CHECK(target.scalar_type() == at::kLong, "tp: cross_entropy: targets of dtype ", target.scalar_type(),
               ", not int64 class indices");
  const auto r = options.reduction();
  TANDEM_CHECK(r == at::Reduction::None || r == at::Reduction::Sum || r == at::Reduction::Mean,
               "tp: cross_entropy: reduction ", static_cast<int64_t>(r), " is none of None, Sum and Mean");
  const auto expected = local_logits.sizes().slice(0, local_logits.dim() - 1);
  TANDEM_CHECK(target.sizes() == expected, "tp: cross_entropy: targets of shape ", target.sizes(),
               " for logits of shape ", local_logits.sizes(), " (expected ", expected, ")");
  return VocabParallelCrossEntropy::apply(local_logits, target, group, options);
}

}  // namespace tandem::tp
