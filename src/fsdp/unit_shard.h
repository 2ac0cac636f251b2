#pragma once
// Internal: one FSDP unit's parameters, sharded (Note [Unit layout]).
//
// Note [Unit layout]
// - Each parameter is cut along dim 0, as FSDP2 does: with W ranks, c = ceil(rows / W) rows per
//   rank; rank r owns rows [r·c, min((r+1)·c, rows)), fewer or none for the last ranks. A 0-d
//   parameter is one row of one element.
// - A rank's shards of the unit lie back to back in one flat buffer, each padded to c rows
//   (S elements in all, the same on every rank): one all-gather of S elements per rank gathers
//   the unit, one reduce-scatter of W·S elements reduces its gradients. The padding is zero and
//   stays zero (nothing writes it).
// - Each shard is a leaf tensor of its owned rows, a view into that buffer: the optimizer steps it
//   in place, and the next all-gather sends what it wrote. Its gradient is a view into the
//   reduce-scatter's output.
// - The module's own parameter tensors keep their identity (autograd's leaves, what the modules'
//   forwards read); only their data changes (set_data): empty at rest, views of the unit's gathered
//   storage while the unit is gathered. That storage is one object for the unit's lifetime: freeing
//   releases its memory (its size becomes 0), gathering allocates and fills it again. Autograd saves
//   a parameter, or a view of it (a Linear saves W.t()), by reference to that storage, so what it
//   saved in forward is freed with the unit and valid again once the unit is gathered before its
//   backward, as FSDP2 does with its unsharded parameters' storage.
// - Mixed precision (tandem/fsdp/mixed_precision.h): the shards keep the parameters' own dtype;
//   the gathered storage, and so the module's parameter tensors, are in the compute dtype, from
//   wrapping on. Autograd forgets a parameter's gradient accumulator when set_data changes its
//   dtype (and with it the engine's hooks), so the parameters take the compute dtype before the
//   engine hooks them, as placeholders of their whole shape that use no memory (a 0-d tensor
//   expanded: the accumulator checks gradients against that shape), and never change dtype again. Their gradients come in the
//   compute dtype; the reduce-scatter runs in the reduce dtype; the shards' gradients are added
//   in their own.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "tandem/comm/process_group.h"
#include "tandem/comm/shard_layout.h"
#include "tandem/fsdp/mixed_precision.h"

namespace tandem::fsdp::detail {

class UnitShard {
 public:
  struct Slot {
    std::string name;              // relative to the wrapped root
    at::Tensor param;              // the module's tensor
    comm::RowShardLayout cut;      // its global shape, cut along dim 0 over the group
    int64_t owned_rows = 0;        // this rank's: cut.owned_rows(rank)
    int64_t offset = 0;            // of its shard in the rank's flat buffer
    at::Tensor shard;              // leaf: this rank's owned rows
  };

  /// Copies this rank's rows of `params` (each whole and the same on every rank) into its shards;
  /// the parameters are untouched until take_placeholders().
  /// `replicate`: HSDP's replica group (FullyShardOptions::replicate_group, of two or more), or null.
  UnitShard(std::string name, std::vector<std::pair<std::string, at::Tensor>> params, comm::ProcessGroup& pg,
            comm::ProcessGroup* replicate, const MixedPrecisionPolicy& policy);
  /// Makes each parameter a placeholder of its whole shape in the compute dtype, without memory
  /// (a 0-d zero expanded), until reshard(): the engine hooks the parameters in between (Note
  /// [Unit layout]).
  void take_placeholders();

  const std::string& name() const { return name_; }
  std::vector<Slot>& slots() { return slots_; }
  const std::vector<Slot>& slots() const { return slots_; }
  bool gathered() const { return gathered_; }
  bool gathering() const { return gather_work_ != nullptr || gather_pending_; }
  /// Elements per rank (padding included) and of the whole unit.
  int64_t shard_numel() const { return per_rank_; }
  int64_t unsharded_numel() const;
  at::ScalarType compute_dtype() const { return compute_; }
  at::ScalarType reduce_dtype() const { return reduce_; }
  /// Bytes of the unit gathered (its parameters whole, padding included, in the compute dtype).
  int64_t gathered_bytes() const;

  /// Starts gathering the unit (nothing when gathered or under way).
  void start_gather();
  /// Waits for the gather and points every parameter at its gathered rows.
  void finish_gather();
  /// Frees the gathered parameters (their data becomes empty).
  void reshard();
  /// Every parameter whole, from the shards (their dtype, not the compute one), in slot order.
  /// Collective; the unit's gathered state does not change.
  std::vector<at::Tensor> whole_parameters();
  /// Whether every parameter still holds what this object gave it (the user did not replace one).
  std::string replaced_parameter() const;

  /// Starts the reduce-scatter of the parameters' gradients (each scaled by 1/W as DDP does, W
  /// the shard group's size times the replicas'; zero for a parameter without one) and drops
  /// them. Nothing when no parameter needs a gradient.
  void start_reduce();
  bool reducing() const { return reduce_work_ != nullptr || reduce_pending_ || replica_work_ != nullptr; }
  /// HSDP: waits for the reduce-scatter and starts the all-reduce of its rows across the replicas
  /// (Note [Replicas during backward] in engine.cpp). Whether it started one: false without
  /// replicas, without a reduction, or when it was started already.
  bool chain_replicas();
  /// Waits for the reduction (under HSDP the all-reduce across the replicas too, started here if
  /// it was not) and adds the averaged rows to the shards' gradients (sets them when undefined).
  void finish_reduce();
  /// Waits for it and drops its result (a backward that failed half-way).
  void discard_reduce();
  /// The parameters' whole gradients in the reduce dtype, where the compute dtype differs (FSDP2
  /// accumulates in it under no_sync).
  void upcast_full_gradients();

  /// Bytes held now, by kind (memory accounting): gathered parameters (what saved views may hold
  /// too), shards, the shards' gradients, full-size gradients on the parameters.
  int64_t gathered_now_bytes() const;
  int64_t shard_bytes() const;
  int64_t shard_grad_bytes() const;
  int64_t full_grad_bytes() const;
  /// Host seconds spent waiting for this unit's all-gathers and reduce-scatters, since construction.
  double gather_wait_seconds() const { return gather_wait_s_; }
  double reduce_wait_seconds() const { return reduce_wait_s_; }
  /// Gathers started since construction (a world of one counts them too).
  int64_t gathers() const { return gathers_; }

 private:
  /// From an all-gather's W x S rank-major rows into `into` (W·S elements): each parameter's rows
  /// contiguous, its W chunks one after the other, then the padding.
  void unpack(const at::Tensor& rank_major, const at::Tensor& into) const;
  /// A parameter, whole, as a view of what unpack() wrote.
  at::Tensor whole_in(const at::Tensor& unpacked, const Slot& slot) const;

  std::string name_;
  comm::ProcessGroup& pg_;
  comm::ProcessGroup* replicate_ = nullptr;  // HSDP's replicas (two or more), or null
  int64_t world_ = 1, rank_ = 0, per_rank_ = 0;
  at::ScalarType compute_ = at::kFloat, reduce_ = at::kFloat;  // the shards are local_'s dtype
  std::vector<Slot> slots_;
  at::Tensor local_;                    // this rank's S elements: the shards and their padding
  at::Tensor gathered_buffer_;          // W·S elements, each parameter's rows contiguous; its storage
                                        // lives as long as this object, its memory only while gathered
  at::Tensor gather_input_;             // the shards in the compute dtype, until the all-gather ends
  at::Tensor gather_output_;            // the all-gather's output (rank-major) until copied
  c10::intrusive_ptr<c10d::Work> gather_work_;
  bool gather_pending_ = false;         // started without a collective (world 1)
  bool gathered_ = false;
  at::Tensor reduce_output_;            // S elements
  at::Tensor reduce_input_;             // W·S elements, kept until the reduce-scatter ends
  c10::intrusive_ptr<c10d::Work> reduce_work_;
  c10::intrusive_ptr<c10d::Work> replica_work_;  // HSDP: the all-reduce of reduce_output_ across the replicas
  bool reduce_pending_ = false;
  at::Tensor inverse_world_;
  double gather_wait_s_ = 0, reduce_wait_s_ = 0;
  int64_t gathers_ = 0;
};

}  // namespace tandem::fsdp::detail
