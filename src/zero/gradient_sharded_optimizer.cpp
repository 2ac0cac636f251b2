#include "tandem/zero/gradient_sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "tandem/comm/shard_layout.h"
#include "tandem/ddp/bucket_assignment.h"
#include "tandem/ddp/options.h"
#include "tandem/error.h"
#include "tandem/zero/clip_grad_norm.h"
#include "zero/reduce_scatter_buckets.h"
#include "tandem/zero/step_guards.h"

namespace tandem::zero {
GradientShardedOptimizer::GradientShardedOptimizer(torch::optim::Optimizer& optimizer, ddp::Reducer& reducer,
                                                   std::shared_ptr<comm::ProcessGroup> pg)
    : optimizer_(optimizer), pg_(std::move(pg)), kind_(kind_of(optimizer)) {
  TANDEM_CHECK(pg_, "ZeRO-2: no process group");
  TANDEM_CHECK(kind_ != OptimizerKind::None,
               "ZeRO-2: this optimizer type is not one ZeRO-2 can step in flat slices (a step that is exact "
               "element by element): use SGD, Adam, AdamW, RMSprop or Adagrad, or zero_stage 1");
  params_ = reducer.parameters();
  std::unordered_map<const void*, size_t>& index_of = index_of_;
  for (size_t i = 0; i < params_.size(); ++i) index_of[params_[i].unsafeGetTensorImpl()] = i;
  std::vector<size_t> group_of(params_.size(), std::numeric_limits<size_t>::max());
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    all_.push_back(optimizer.param_groups()[g].params());
    for (const auto& p : all_.back()) {
      auto it = index_of.find(p.unsafeGetTensorImpl());
      TANDEM_CHECK(it != index_of.end(), "ZeRO-2: a parameter of param group ", g,
                   " is not one the DDP model reduces (frozen, or of another model)");
      TANDEM_CHECK(group_of[it->second] == std::numeric_limits<size_t>::max(), "ZeRO-2: a parameter is in two param groups");
      group_of[it->second] = g;
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    TANDEM_CHECK(group_of[i] != std::numeric_limits<size_t>::max(), "ZeRO-2: the model's parameter ", i,
                 " is in no param group of the optimizer; ZeRO-2 needs the optimizer to own every parameter DDP reduces");
    TANDEM_CHECK(params_[i].is_floating_point(), "ZeRO-2: parameter ", i, " is not floating point");
  }
  // Note [Flat shards]: DDP's bucket rule (Note [Bucket assignment]) walked in reverse registration
  // order with the param group as part of a bucket's kind, buckets kept in the order they fill.
  std::vector<ddp::TensorSpec> specs;
  std::vector<int64_t> reverse;
  for (size_t i = params_.size(); i-- > 0;) reverse.push_back(static_cast<int64_t>(i));
  for (size_t i = 0; i < params_.size(); ++i) {
    specs.push_back(ddp::TensorSpec{static_cast<int64_t>(params_[i].nbytes()), params_[i].scalar_type(),
                                    params_[i].device(), static_cast<int64_t>(group_of[i])});
  }
  const auto layout = ddp::compute_bucket_assignment(specs, ddp::bucket_size_limits(reducer.options()), reverse);
  const int64_t r = pg_->rank();
  shards_.resize(all_.size());
  for (const auto& members : layout.buckets) {
    FlatBucket b;
    b.group = group_of[static_cast<size_t>(members.front())];
    int64_t numel = 0;
    for (auto i : members) {
      b.params.push_back(static_cast<size_t>(i));
      b.offsets.push_back(numel);
      numel += params_[static_cast<size_t>(i)].numel();
    }
    const comm::ShardLayout shard_layout{numel, pg_->size()};
    b.padded = shard_layout.padded();
    b.per_rank = shard_layout.shard();
    const int64_t begin = r * b.per_rank, end = begin + b.per_rank;
    for (size_t k = 0; k < b.params.size(); ++k) {
      const int64_t lo = std::max(begin, b.offsets[k]), hi = std::min(end, b.offsets[k] + params_[b.params[k]].numel());
      if (lo < hi) b.mine.push_back(Piece{b.params[k], lo - b.offsets[k], lo - begin, hi - lo});
    }
    b.shard = at::zeros({b.per_rank}, params_[b.params.front()].options()).requires_grad_(true);
    b.grad = at::zeros({b.per_rank}, params_[b.params.front()].options().requires_grad(false));
    shards_[b.group].push_back(b.shard);
    buckets_.push_back(std::move(b));
  }
  // Last, once nothing above can throw: from here on the reducer keeps no full gradient.
  std::vector<at::Tensor> slices;
  for (const auto& b : buckets_) slices.push_back(b.grad);
  reducer.set_bucket_reduction(std::make_unique<detail::ReduceScatterBuckets>(pg_, std::move(slices), reducer.names()),
                               layout);
  for (auto& b : buckets_) b.shard.mutable_grad() = b.grad;
  optimizer.state().clear();  // state of the parameters themselves (Adagrad's, or earlier steps')
  for (size_t g = 0; g < all_.size(); ++g) {
    optimizer.param_groups()[g].params() = shards_[g];
    for (const auto& shard : shards_[g]) {
      if (auto s = initial_state(kind_, optimizer.param_groups()[g].options(), shard)) {
        optimizer.state()[shard.unsafeGetTensorImpl()] = std::move(s);
      }
    }
  }
}


void GradientShardedOptimizer::step() {
  step([](torch::optim::Optimizer& o) {
    o.step();
    return true;
  });
}

bool GradientShardedOptimizer::step(const std::function<bool(torch::optim::Optimizer&)>& stepper) {
  check_groups_unchanged(optimizer_, shards_, "GradientShardedOptimizer");
  {
    at::NoGradGuard no_grad;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      auto& bucket = buckets_[b];
      for (const auto& piece : bucket.mine) {
        bucket.shard.narrow(0, piece.shard_offset, piece.length)
            .copy_(params_[piece.param].view(-1).narrow(0, piece.param_offset, piece.length));
      }
      bucket.shard.mutable_grad() = bucket.grad;
    }
  }
  const bool stepped = agreed_step(*pg_, [&] {
    at::NoGradGuard no_grad;
    return stepper(optimizer_);
  });
  if (stepped) gather_parameters();
  return stepped;
}

void GradientShardedOptimizer::gather_parameters() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> whole;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (auto& bucket : buckets_) {
    whole.push_back(at::empty({bucket.padded}, bucket.shard.options().requires_grad(false)));
    at::Tensor mine = bucket.shard.detach();
    works.push_back(pg_->all_gather_into_async(whole.back(), mine));
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pg_->wait(works[b], "ZeRO-2 parameter all_gather");
    const auto& bucket = buckets_[b];
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      auto& param = params_[bucket.params[k]];
      param.view(-1).copy_(whole[b].narrow(0, bucket.offsets[k], param.numel()));
    }
    whole[b].reset();
  }
}

void GradientShardedOptimizer::zero_grad() {
  // The shards' gradients stay the slices the reducer reduce-scatters into (a GradScaler unscales
  // them before step()).
  at::NoGradGuard no_grad;
  for (auto& bucket : buckets_) bucket.grad.zero_();
  for (auto& p : params_) p.mutable_grad().reset();
}

double GradientShardedOptimizer::clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm,
                                                double norm_type) {
  // Each parameter's pieces of this rank's slices, once per time it is given (torch counts, and
  // clips, a parameter given twice twice).
  GradientPieces pieces;
  pieces.cut = true;
  for (const auto& p : parameters) {
    const auto mine = gradient_pieces(p);
    if (!mine) {
      TANDEM_CHECK(!p.requires_grad(), "clip_grad_norm: a parameter of shape ", p.sizes(),
                   " is none of the ZeRO-2 model's, whose gradients are sharded: clip it apart");
      continue;  // frozen: no gradient, as torch skips it
    }
    for (const auto& g : *mine) pieces.add(g, true, p);
    if (mine->empty()) pieces.add({}, false, p);  // none here: the parameter's device, for the all-reduce
  }
  return zero::clip_grad_norm(pieces, pg_.get(), max_norm, norm_type);
}

std::optional<std::vector<at::Tensor>> GradientShardedOptimizer::gradient_pieces(const at::Tensor& param) const {
  auto it = index_of_.find(param.unsafeGetTensorImpl());
  if (it == index_of_.end()) return std::nullopt;
  std::vector<at::Tensor> out;  // views of the reducer's gradient shards
  for (const auto& bucket : buckets_) {
    for (const auto& piece : bucket.mine) {
      if (piece.param == it->second) out.push_back(bucket.grad.narrow(0, piece.shard_offset, piece.length));
    }
  }
  return out;
}

int64_t GradientShardedOptimizer::shard_numel() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.per_rank;
  return n;
}

std::vector<std::pair<at::Tensor, std::vector<std::pair<std::string, at::Tensor>>>>
GradientShardedOptimizer::gather_state() {
  at::NoGradGuard no_grad;
  std::vector<std::pair<at::Tensor, std::vector<std::pair<std::string, at::Tensor>>>> out;
  // Which buckets have state: the same on every rank unless a step failed part-way on one; agreed
  // first, so that the all-gathers below match.
  at::Tensor has = at::zeros({2, static_cast<int64_t>(buckets_.size())}, at::kInt);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const int v = optimizer_.state().count(buckets_[b].shard.unsafeGetTensorImpl()) ? 1 : 0;
    has[0][static_cast<int64_t>(b)] = v;
    has[1][static_cast<int64_t>(b)] = -v;
  }
  pg_->all_reduce(has, comm::ReduceOp::Max);
  TANDEM_CHECK(at::equal(has[0], -has[1]), "ZeRO-2: the ranks disagree on which slices have optimizer state (a step "
                                           "failed on some ranks only?); cannot save it");
  for (auto& bucket : buckets_) {
    auto it = optimizer_.state().find(bucket.shard.unsafeGetTensorImpl());
    if (it == optimizer_.state().end()) continue;
    std::vector<std::vector<std::pair<std::string, at::Tensor>>> per_param(bucket.params.size());
    for (auto& [key, t] : state_tensors(kind_, *it->second)) {
      if (t.dim() == 0) {  // step: one for the whole shard
        for (auto& p : per_param) p.emplace_back(key, t.clone());
        continue;
      }
      at::Tensor whole = at::empty({bucket.padded}, t.options());
      at::Tensor mine = t.contiguous();
      pg_->all_gather_into(whole, mine);
      for (size_t k = 0; k < bucket.params.size(); ++k) {
        const auto& param = params_[bucket.params[k]];
        per_param[k].emplace_back(key, whole.narrow(0, bucket.offsets[k], param.numel()).view(param.sizes()).clone());
      }
    }
    for (size_t k = 0; k < bucket.params.size(); ++k) out.emplace_back(params_[bucket.params[k]], std::move(per_param[k]));
  }
  return out;
}

std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> GradientShardedOptimizer::build_state(
    const std::function<const torch::optim::OptimizerParamState*(const at::Tensor&)>& state_of) const {
  at::NoGradGuard no_grad;
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> built(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& bucket = buckets_[b];
    size_t with_state = 0;
    std::map<std::string, at::Tensor> slices;
    std::optional<int64_t> step;  // a shard has one
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const auto* state = state_of(params_[bucket.params[k]]);
      if (!state) continue;
      ++with_state;
      for (auto& [key, t] : state_tensors(kind_, *state)) {
        if (t.dim() == 0) {
          const int64_t value = t.item<int64_t>();
          TANDEM_CHECK(!step || *step == value, "ZeRO-2: the parameters of one bucket have different step counts (",
                       *step, " and ", value, "); a flat shard has one");
          step = value;
          slices[key] = t;
          continue;
        }
        auto& slice = slices[key];
        if (!slice.defined()) slice = at::zeros({bucket.per_rank}, t.options());
        at::Tensor flat = t.reshape({-1});
        for (const auto& piece : bucket.mine) {
          if (piece.param != bucket.params[k]) continue;
          slice.narrow(0, piece.shard_offset, piece.length).copy_(flat.narrow(0, piece.param_offset, piece.length));
        }
      }
    }
    TANDEM_CHECK(with_state == 0 || with_state == bucket.params.size(), "ZeRO-2: ", with_state, " of the ",
                 bucket.params.size(), " parameters of one bucket have optimizer state; a flat shard needs all or none");
    if (with_state > 0) {
      built[b] = make_state(kind_, std::move(slices), bucket.shard, "ZeRO-2: the checkpoint's state");
    } else {
      built[b] = initial_state(kind_, optimizer_.param_groups()[bucket.group].options(), bucket.shard);  // Adagrad's
    }
  }
  return built;
}

void GradientShardedOptimizer::install_state(std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> built) {
  for (size_t b = 0; b < buckets_.size() && b < built.size(); ++b) {
    void* key = buckets_[b].shard.unsafeGetTensorImpl();
    optimizer_.state().erase(key);
    if (built[b]) optimizer_.state()[key] = std::move(built[b]);
  }
}

}  // namespace tandem::zero
