#include "tandem/fsdp/fsdp_optimizer.h"

#include <map>

#include "tandem/error.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/zero/step_guards.h"

namespace tandem::fsdp {

FsdpOptimizer::FsdpOptimizer(torch::optim::Optimizer& optimizer, std::shared_ptr<ShardedParameters> engine)
    : optimizer_(optimizer), engine_(std::move(engine)), kind_(zero::kind_of(optimizer)) {
  TANDEM_CHECK(kind_ != zero::OptimizerKind::None,
               "fsdp: this optimizer type is not one FSDP can step in row shards (a step that is exact element by "
               "element): use SGD, Adam, AdamW, RMSprop or Adagrad");
  for (const auto& group : optimizer.param_groups()) all_.push_back(group.params());
  shard_optimizer(optimizer, *engine_);  // (Adagrad's initial state made again for the shards)
  for (const auto& group : optimizer.param_groups()) shards_.push_back(group.params());
}

bool FsdpOptimizer::step(const std::function<bool(torch::optim::Optimizer&)>& stepper) {
  zero::check_groups_unchanged(optimizer_, shards_, "FsdpOptimizer");
  // The next forward gathers what this step wrote into the shards.
  return zero::agreed_step(*engine_->process_group(), [&] {
    at::NoGradGuard no_grad;
    return stepper(optimizer_);
  });
}

void FsdpOptimizer::step() {
  step([](torch::optim::Optimizer& o) {
    o.step();
    return true;
  });
}

void FsdpOptimizer::zero_grad() { optimizer_.zero_grad(); }

double FsdpOptimizer::clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  return engine_->clip_grad_norm(parameters, max_norm, norm_type);
}

std::optional<std::vector<at::Tensor>> FsdpOptimizer::gradient_pieces(const at::Tensor& param) const {
  const at::Tensor shard = engine_->shard_of(param);
  if (!shard.defined()) return std::nullopt;
  return std::vector<at::Tensor>{shard.grad()};
}

std::vector<std::pair<at::Tensor, zero::PartitionedOptimizer::NamedState>> FsdpOptimizer::gather_state() {
  at::NoGradGuard no_grad;
  auto& pg = *engine_->process_group();
  // Which parameters have state, agreed (a rank without rows still steps its empty shard).
  std::vector<std::pair<size_t, size_t>> order;
  for (size_t g = 0; g < shards_.size(); ++g) {
    for (size_t i = 0; i < shards_[g].size(); ++i) order.emplace_back(g, i);
  }
  at::Tensor has = at::zeros({static_cast<int64_t>(order.size())}, at::kInt);
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& shard = shards_[order[k].first][order[k].second];
    has[k] = optimizer_.state().count(shard.unsafeGetTensorImpl()) ? 1 : 0;
  }
  pg.all_reduce(has, comm::ReduceOp::Min);
  std::vector<std::pair<at::Tensor, NamedState>> out;
  for (size_t k = 0; k < order.size(); ++k) {
    if (has[k].item<int>() == 0) continue;
    const auto& [g, i] = order[k];
    const auto& shard = shards_[g][i];
    const auto spec = engine_->spec_of(all_[g][i]).value();
    NamedState whole;
    for (auto& [key, t] : zero::state_tensors(kind_, *optimizer_.state().at(shard.unsafeGetTensorImpl()))) {
      if (key == "step") {  // the same on every rank
        whole.emplace_back(key, t.clone());
        continue;
      }
      at::Tensor chunk = at::zeros({spec.chunk_rows, spec.row_numel}, t.options());
      if (spec.owned_rows > 0) chunk.narrow(0, 0, spec.owned_rows).copy_(t.reshape({spec.owned_rows, spec.row_numel}));
      at::Tensor rows = at::cat(pg.all_gather(chunk), 0).narrow(0, 0, spec.rows);
      whole.emplace_back(key, rows.reshape(spec.shape).clone());
    }
    out.emplace_back(all_[g][i], std::move(whole));
  }
  return out;
}

zero::PartitionedOptimizer::BuiltState FsdpOptimizer::build_state(const StateOf& state_of) const {
  at::NoGradGuard no_grad;
  BuiltState built;
  for (size_t g = 0; g < shards_.size(); ++g) {
    for (size_t i = 0; i < shards_[g].size(); ++i) {
      const auto& shard = shards_[g][i];
      const auto* state = state_of(all_[g][i]);
      if (!state) {
        built.push_back(zero::initial_state(kind_, optimizer_.param_groups()[g].options(), shard));
        continue;
      }
      std::map<std::string, at::Tensor> rows;
      for (auto& [key, t] : zero::state_tensors(kind_, *state)) {
        rows[key] = key == "step" ? t : t.reshape(shard.sizes());
      }
      built.push_back(zero::make_state(kind_, std::move(rows), shard, "fsdp: the checkpoint's state"));
    }
  }
  return built;
}

std::vector<FsdpOptimizer::OwnedState> FsdpOptimizer::owned_state() const {
  std::vector<OwnedState> out;
  for (size_t g = 0; g < shards_.size(); ++g) {
    for (size_t i = 0; i < shards_[g].size(); ++i) {
      auto it = optimizer_.state().find(shards_[g][i].unsafeGetTensorImpl());
      if (it == optimizer_.state().end()) continue;
      const auto spec = engine_->spec_of(all_[g][i]).value();
      const std::vector<int64_t> rows_shape = spec.owned_shape();
      for (auto& [key, t] : zero::state_tensors(kind_, *it->second)) {
        if (key == "step") {
          out.push_back({all_[g][i], key, t, 0, {}});
        } else if (spec.owned_rows > 0 || (spec.rows == 0 && engine_->process_group()->rank() == 0)) {
          // (A parameter of no rows at all: rank 0 writes its empty piece, so that it is named.)
          out.push_back({all_[g][i], key, t.reshape(rows_shape), spec.first_row, spec.shape});
        }
      }
    }
  }
  return out;
}

ShardSpec FsdpOptimizer::spec_of(const at::Tensor& param) const { return engine_->spec_of(param).value(); }

zero::PartitionedOptimizer::HeldRows FsdpOptimizer::held_rows(const at::Tensor& param) const {
  const ShardSpec spec = spec_of(param);
  return {spec.shape, shard_options(param), spec.first_row, spec.owned_rows};
}

at::TensorOptions FsdpOptimizer::shard_options(const at::Tensor& param) const {
  return engine_->shard_of(param).options();
}

void FsdpOptimizer::install_state(BuiltState built) {
  size_t k = 0;
  for (const auto& group : shards_) {
    for (const auto& shard : group) {
      if (k >= built.size()) return;
      void* key = shard.unsafeGetTensorImpl();
      optimizer_.state().erase(key);
      if (built[k]) optimizer_.state()[key] = std::move(built[k]);
      ++k;
    }
  }
}

}  // namespace tandem::fsdp
