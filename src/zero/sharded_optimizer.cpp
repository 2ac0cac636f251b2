#include "tandem/zero/sharded_optimizer.h"

#include <torch/optim/lbfgs.h>

#include "tandem/error.h"
#include "tandem/zero/clip_grad_norm.h"
#include "tandem/zero/partition.h"
#include "tandem/zero/step_guards.h"

namespace tandem::zero {

// Note [Sharding an optimizer in place]
// LibTorch's optimizers keep one state entry per parameter, created at its first step, and step
// only the parameters of their param groups. Taking the parameters another rank owns out of the
// groups is therefore all it takes for any of them (SGD, Adam, AdamW, RMSprop, Adagrad) to hold
// state for 1/N of the model and to step only that: no per-type code, the groups' hyper-
// parameters (learning rate, weight decay) untouched. Each parameter's update depends only on its
// gradient, its state and its group's options, so the owner computes exactly what the unsharded
// optimizer would, and a broadcast copies those bits to the other ranks: ZeRO-1 equals plain DDP
// bit for bit. State another rank owns is dropped (Adagrad makes its state at construction; an
// optimizer that stepped before being sharded holds it all): each owner keeps its own, so sharding
// an optimizer mid-training continues it exactly. LBFGS is the exception (its step is a line
// search over every parameter at once) and is refused. The groups get every parameter back when the ShardedOptimizer goes, so the
// optimizer is whole again (with state for the parameters this rank owned).


ShardedOptimizer::ShardedOptimizer(torch::optim::Optimizer& optimizer, std::shared_ptr<comm::ProcessGroup> pg)
    : optimizer_(optimizer), pg_(std::move(pg)) {
  TANDEM_CHECK(pg_, "ShardedOptimizer: no process group");
  TANDEM_CHECK(!dynamic_cast<torch::optim::LBFGS*>(&optimizer),
               "ShardedOptimizer: LBFGS cannot be sharded (its step searches along every parameter at once); "
               "use SGD, Adam, AdamW, RMSprop or Adagrad, or LBFGS without ZeRO");
  std::vector<std::vector<int64_t>> numels;
  for (auto& group : optimizer.param_groups()) {
    all_.push_back(group.params());
    numels.emplace_back();
    for (const auto& p : group.params()) numels.back().push_back(p.numel());
  }
  owners_ = assign_owners(numels, pg_->size());
  by_rank_.resize(static_cast<size_t>(pg_->size()));
  owned_.resize(all_.size());
  for (size_t g = 0; g < all_.size(); ++g) {
    for (size_t i = 0; i < all_[g].size(); ++i) {
      by_rank_[static_cast<size_t>(owners_[g][i])].push_back(all_[g][i]);
      owner_by_impl_[all_[g][i].unsafeGetTensorImpl()] = owners_[g][i];
      if (owners_[g][i] == pg_->rank()) {
        owned_[g].push_back(all_[g][i]);
      } else {
        // State another rank owns: made eagerly by Adagrad, or by steps taken before sharding.
        optimizer.state().erase(all_[g][i].unsafeGetTensorImpl());
      }
    }
    optimizer.param_groups()[g].params() = owned_[g];
  }
}


void ShardedOptimizer::step() {
  step([](torch::optim::Optimizer& optimizer) {
    optimizer.step();
    return true;
  });
}

bool ShardedOptimizer::step(const Stepper& stepper) {
  check_groups_unchanged(optimizer_, owned_, "ShardedOptimizer");
  for (const auto& group : all_) {
    for (const auto& p : group) {
      TANDEM_CHECK(!p.grad().defined() || !p.grad().is_sparse(),
                   "ShardedOptimizer: a parameter has a sparse gradient (e.g. Embedding(sparse=true)); ZeRO shards "
                   "dense gradients only: use a dense embedding");
    }
  }
  const bool stepped = agreed_step(*pg_, [&] {
    at::NoGradGuard no_grad;
    return stepper(optimizer_);
  });
  if (stepped) sync_parameters();
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < all_.size(); ++g) {
    for (size_t i = 0; i < all_[g].size(); ++i) {
      if (owners_[g][i] != pg_->rank()) all_[g][i].mutable_grad().reset();
    }
  }
  return stepped;
}

void ShardedOptimizer::sync_parameters() {
  for (int r = 0; r < pg_->size(); ++r) {
    auto& theirs = by_rank_[static_cast<size_t>(r)];
    if (!theirs.empty()) pg_->broadcast_coalesced(theirs, r);
  }
}

double ShardedOptimizer::clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  GradientPieces pieces;
  for (const auto& p : parameters) add_owned_gradient(pieces, p, owner_of(p), pg_->rank());
  return zero::clip_grad_norm(pieces, pg_.get(), max_norm, norm_type);
}

void ShardedOptimizer::zero_grad(bool set_to_none) {
  for (const auto& group : all_) {
    for (const auto& p : group) {
      if (!p.mutable_grad().defined()) continue;
      if (set_to_none) {
        p.mutable_grad().reset();
      } else {
        p.mutable_grad().detach_();
        p.mutable_grad().zero_();
      }
    }
  }
}

int ShardedOptimizer::owner_of(const at::Tensor& param) const {
  auto it = owner_by_impl_.find(param.unsafeGetTensorImpl());
  return it == owner_by_impl_.end() ? -1 : it->second;
}

std::vector<int64_t> ShardedOptimizer::owned_numel() const {
  std::vector<int64_t> out;
  for (const auto& params : by_rank_) {
    int64_t n = 0;
    for (const auto& p : params) n += p.numel();
    out.push_back(n);
  }
  return out;
}

}  // namespace tandem::zero
