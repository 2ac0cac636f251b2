#include "fsdp/unit_shard.h"

#include <chrono>
#include <utility>

#include <torch/csrc/autograd/generated/variable_factories.h>

#include "common/host_buffer_pool.h"
#include "common/storage_alias.h"
#include "tandem/error.h"

namespace tandem::fsdp::detail {

namespace {
// Waits for `work` and adds the host time it blocked to `clock`: the communication compute did not
// hide (Note [Exposed communication] in engine.cpp).
void timed_wait(comm::ProcessGroup& pg, c10::intrusive_ptr<c10d::Work> work, const std::string& what, double& clock) {
  const auto start = std::chrono::steady_clock::now();
  pg.wait(work, what);
  clock += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

UnitShard::UnitShard(std::string name, std::vector<std::pair<std::string, at::Tensor>> params, comm::ProcessGroup& pg,
                     comm::ProcessGroup* replicate, const MixedPrecisionPolicy& policy)
    : name_(std::move(name)), pg_(pg), replicate_(replicate),
      world_(pg.size()), rank_(pg.rank()) {
  at::TensorOptions options;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& [param_name, param] = params[i];
    if (i == 0) {
      options = param.options().requires_grad(false);
    } else {
      TANDEM_CHECK(param.scalar_type() == options.dtype().toScalarType() && param.device() == options.device(),
                   "fsdp: unit '", name_, "' mixes ", c10::toString(options.dtype().toScalarType()), " on ",
                   options.device(), " and ", c10::toString(param.scalar_type()), " on ", param.device(), " ('",
                   param_name, "'); put parameters of one dtype and device in a unit");
    }
    Slot slot;
    slot.name = param_name;
    slot.param = param;
    slot.cut = comm::RowShardLayout::of(param.sizes().vec(), world_);
    slot.owned_rows = slot.cut.owned_rows(rank_);
    slot.offset = per_rank_;
    per_rank_ += slot.cut.chunk_numel();
    slots_.push_back(std::move(slot));
  }
  local_ = at::zeros({per_rank_}, options);
  compute_ = policy.param_dtype().value_or(local_.scalar_type());
  reduce_ = policy.reduce_dtype().value_or(compute_);
  for (auto& slot : slots_) {
    at::Tensor mine = tandem::detail::storage_alias(local_, slot.offset, slot.cut.owned_shape(rank_));
    if (slot.owned_rows > 0) {
      at::Tensor whole = slot.param.detach().reshape({slot.cut.rows, slot.cut.row_numel});
      mine.view({slot.owned_rows, slot.cut.row_numel})
          .copy_(whole.narrow(0, slot.cut.first_row(rank_), slot.owned_rows));
    }
    // A leaf of its own (the optimizer's parameter) that shares the buffer's storage.
    slot.shard = mine.requires_grad_(slot.param.requires_grad());
  }
  // The average is over every rank that computed a gradient: the shard group's, times the replicas.
  const int64_t averaged = world_ * (replicate_ ? replicate_->size() : 1);
  inverse_world_ = at::scalar_tensor(1.0 / static_cast<double>(averaged), at::kDouble);
  inverse_world_.unsafeGetTensorImpl()->set_wrapped_number(true);
}

void UnitShard::take_placeholders() {
  at::NoGradGuard no_grad;
  const at::Tensor nothing = at::zeros({}, local_.options().dtype(compute_));
  for (auto& slot : slots_) slot.param.set_data(nothing.expand(slot.cut.shape));
}

int64_t UnitShard::gathered_bytes() const {
  return world_ * per_rank_ * static_cast<int64_t>(c10::elementSize(compute_));
}

int64_t UnitShard::unsharded_numel() const {
  int64_t n = 0;
  for (const auto& slot : slots_) n += slot.cut.rows * slot.cut.row_numel;
  return n;
}

void UnitShard::start_gather() {
  if (gathered_ || gathering()) return;
  ++gathers_;
  if (world_ == 1 || per_rank_ == 0) {
    gather_pending_ = true;
    return;
  }
  const auto options = local_.options().dtype(compute_);
  gather_input_ = local_;
  if (compute_ != local_.scalar_type()) {
    gather_input_ = tandem::detail::pooled_empty(per_rank_, options);
    gather_input_.copy_(local_);
  }
  gather_output_ = tandem::detail::pooled_empty(world_ * per_rank_, options);  // Note [Host buffer pool]
  gather_work_ = pg_.all_gather_into_async(gather_output_, gather_input_);
}

void UnitShard::finish_gather() {
  if (gathered_) return;
  if (!gathering()) start_gather();
  at::Tensor rank_major;  // W x S: rank r's shards in row r
  if (!gather_work_) {  // world 1, or nothing to gather
    rank_major = local_.view({1, per_rank_}).expand({world_, per_rank_});
  } else {
    timed_wait(pg_, std::exchange(gather_work_, nullptr), "fsdp all-gather of unit '" + name_ + "'", gather_wait_s_);
    rank_major = std::exchange(gather_output_, at::Tensor()).view({world_, per_rank_});
    gather_input_ = at::Tensor();
  }
  gather_pending_ = false;
  // Each parameter's rows contiguous: its W chunks one after the other, then the padding. Into the
  // unit's one storage, allocated again if reshard() released it (Note [Unit layout]).
  const size_t nbytes = static_cast<size_t>(gathered_bytes());
  if (!gathered_buffer_.defined()) {
    gathered_buffer_ = tandem::detail::pooled_empty(world_ * per_rank_, local_.options().dtype(compute_));  // refilled from the pool too
  } else if (gathered_buffer_.storage().nbytes() != nbytes) {
    c10::StorageImpl* storage = gathered_buffer_.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
    storage->set_nbytes(nbytes);
  }
  unpack(rank_major, gathered_buffer_);
  at::NoGradGuard no_grad;
  for (auto& slot : slots_) slot.param.set_data(whole_in(gathered_buffer_, slot));
  gathered_ = true;
}

void UnitShard::reshard() {
  if (gather_work_) {  // a prefetch nobody waited for: its buffers must outlive it
    timed_wait(pg_, std::exchange(gather_work_, nullptr), "fsdp all-gather of unit '" + name_ + "'", gather_wait_s_);
    gather_output_ = gather_input_ = at::Tensor();
  }
  gather_pending_ = false;
  for (auto& slot : slots_) {
    at::NoGradGuard no_grad;
    slot.param.set_data(at::empty({0}, local_.options().dtype(compute_)));
  }
  // Release the storage itself, not only the parameters' handles on it: autograd's saved views of
  // the parameters (a Linear saves W.t()) share it, and would keep it alive until backward. Their
  // data is gathered into this same storage again before the unit's backward reads it.
  if (gathered_buffer_.defined() && gathered_buffer_.storage().nbytes() > 0) {
    c10::StorageImpl* storage = gathered_buffer_.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
    storage->set_nbytes(0);
  }
  gathered_ = false;
}

std::vector<at::Tensor> UnitShard::whole_parameters() {
  at::Tensor rank_major;  // W x S, as in finish_gather, in the shards' dtype
  if (world_ == 1 || per_rank_ == 0) {
    rank_major = local_.view({1, per_rank_}).expand({world_, per_rank_});
  } else {
    at::Tensor output = at::empty({world_ * per_rank_}, local_.options());
    pg_.wait(pg_.all_gather_into_async(output, local_), "fsdp all-gather of unit '" + name_ + "' (its shards)");
    rank_major = output.view({world_, per_rank_});
  }
  const at::Tensor unpacked = at::empty({world_ * per_rank_}, local_.options());
  unpack(rank_major, unpacked);
  std::vector<at::Tensor> whole;
  for (const auto& slot : slots_) whole.push_back(whole_in(unpacked, slot));
  return whole;
}

void UnitShard::unpack(const at::Tensor& rank_major, const at::Tensor& into) const {
  for (const auto& slot : slots_) {
    const int64_t chunk = slot.cut.chunk_numel();
    if (chunk == 0) continue;
    into.narrow(0, world_ * slot.offset, world_ * chunk).view({world_, chunk}).copy_(rank_major.narrow(1, slot.offset, chunk));
  }
}

at::Tensor UnitShard::whole_in(const at::Tensor& unpacked, const Slot& slot) const {
  return unpacked.narrow(0, world_ * slot.offset, slot.cut.rows * slot.cut.row_numel).view(slot.cut.shape);
}

std::string UnitShard::replaced_parameter() const {
  for (const auto& slot : slots_) {
    const bool expected = gathered_ ? slot.param.sizes() == at::IntArrayRef(slot.cut.shape) : slot.param.numel() == 0;
    if (!expected) return slot.name;
  }
  return "";
}

void UnitShard::start_reduce() {
  if (reducing()) return;
  bool any = false;
  for (const auto& slot : slots_) any = any || slot.param.requires_grad();
  if (!any) return;
  // Every element is written once: a rank's rows (× 1/W) or zero (the padding, a missing gradient).
  const auto options = local_.options().dtype(reduce_);
  reduce_input_ = tandem::detail::pooled_empty(world_ * per_rank_, options);  // Note [Host buffer pool]
  at::Tensor rank_major = reduce_input_.view({world_, per_rank_});
  for (auto& slot : slots_) {
    at::Tensor grad = slot.param.grad();
    at::Tensor flat = grad.defined() ? grad.reshape({-1}) : at::Tensor();
    for (int64_t r = 0; r < world_; ++r) {
      const int64_t first = slot.cut.first_row(r), owned = slot.cut.owned_rows(r), row = slot.cut.row_numel;
      at::Tensor chunk = rank_major[r].narrow(0, slot.offset, slot.cut.chunk_numel());
      if (flat.defined() && owned > 0) {
        // × 1/W while copying, as DDP's reducer does: the same rounding as DDP's average.
        at::Tensor into = chunk.narrow(0, 0, owned * row);
        at::Tensor mine = flat.narrow(0, first * row, owned * row);
        if (mine.scalar_type() == reduce_) {
          at::mul_out(into, mine, inverse_world_);
        } else {  // into the reduce dtype first: the average is taken in it, as FSDP2 takes it
          into.copy_(mine);
          into.mul_(inverse_world_);
        }
        chunk.narrow(0, owned * row, (slot.cut.chunk_rows() - owned) * row).zero_();
      } else {
        chunk.zero_();
      }
    }
    if (grad.defined()) slot.param.mutable_grad() = at::Tensor();  // the full-size gradient is not kept
  }
  if (world_ == 1 || per_rank_ == 0) {
    reduce_output_ = reduce_input_.narrow(0, 0, per_rank_);
    reduce_pending_ = true;
    return;
  }
  reduce_output_ = tandem::detail::pooled_empty(per_rank_, options);
  reduce_work_ = pg_.reduce_scatter_async(reduce_output_, reduce_input_);
}

bool UnitShard::chain_replicas() {
  if (!replicate_ || per_rank_ == 0 || replica_work_ || !reduce_output_.defined()) return false;
  if (reduce_work_) {
    timed_wait(pg_, std::exchange(reduce_work_, nullptr), "fsdp reduce-scatter of unit '" + name_ + "'",
               reduce_wait_s_);
  }
  reduce_input_ = at::Tensor();
  // HSDP: the replicas hold the same rows; each has this shard group's sum, the total is theirs.
  replica_work_ = replicate_->all_reduce_async(reduce_output_, comm::ReduceOp::Sum);
  return true;
}

void UnitShard::finish_reduce() {
  if (!reducing()) return;
  if (reduce_work_) {
    timed_wait(pg_, std::exchange(reduce_work_, nullptr), "fsdp reduce-scatter of unit '" + name_ + "'",
               reduce_wait_s_);
  }
  chain_replicas();
  if (replica_work_) {
    timed_wait(*replicate_, std::exchange(replica_work_, nullptr),
               "fsdp all-reduce across the replicas of unit '" + name_ + "'", reduce_wait_s_);
  }
  reduce_pending_ = false;
  reduce_input_ = at::Tensor();
  at::Tensor out = std::exchange(reduce_output_, at::Tensor());
  for (auto& slot : slots_) {
    if (!slot.shard.requires_grad()) continue;
    at::Tensor mine = tandem::detail::storage_alias(out, slot.offset, slot.shard.sizes());
    at::Tensor& grad = slot.shard.mutable_grad();
    if (grad.defined()) {
      grad.add_(mine);
    } else {
      grad = mine.scalar_type() == slot.shard.scalar_type() ? mine : mine.to(slot.shard.scalar_type());
    }
  }
}

void UnitShard::discard_reduce() {
  if (reduce_work_) {
    timed_wait(pg_, std::exchange(reduce_work_, nullptr), "fsdp reduce-scatter of unit '" + name_ + "'",
               reduce_wait_s_);
  }
  if (replica_work_) {
    timed_wait(*replicate_, std::exchange(replica_work_, nullptr),
               "fsdp all-reduce across the replicas of unit '" + name_ + "'", reduce_wait_s_);
  }
  reduce_pending_ = false;
  reduce_input_ = at::Tensor();
  reduce_output_ = at::Tensor();
}

void UnitShard::upcast_full_gradients() {
  if (reduce_ == compute_) return;
  for (auto& slot : slots_) {
    at::Tensor& grad = slot.param.mutable_grad();
    if (grad.defined() && grad.scalar_type() != reduce_) grad = grad.to(reduce_);
  }
}

int64_t UnitShard::gathered_now_bytes() const {  // the storage's real size: what saved views may hold too
  return gathered_buffer_.defined() ? static_cast<int64_t>(gathered_buffer_.storage().nbytes()) : 0;
}

int64_t UnitShard::shard_bytes() const { return per_rank_ * static_cast<int64_t>(local_.element_size()); }

namespace {
int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}
}  // namespace

int64_t UnitShard::shard_grad_bytes() const {
  int64_t n = 0;
  for (const auto& slot : slots_) n += bytes_of(slot.shard.grad());
  return n;
}

int64_t UnitShard::full_grad_bytes() const {
  int64_t n = 0;
  for (const auto& slot : slots_) n += bytes_of(slot.param.grad());
  return n;
}

}  // namespace tandem::fsdp::detail
