#pragma once
// An optimizer whose parameters are this rank's pieces of the model's parameters: ZeRO-2's flat
// slices (zero::GradientShardedOptimizer) and FSDP's row shards (fsdp::FsdpOptimizer). What the
// Accelerator needs to step, clip and checkpoint either, whole parameter by whole parameter.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "tandem/zero/distributed_optimizer.h"

namespace tandem::zero {

class PartitionedOptimizer : public DistributedOptimizer {
 public:
  using NamedState = std::vector<std::pair<std::string, at::Tensor>>;
  using StateOf = std::function<const torch::optim::OptimizerParamState*(const at::Tensor&)>;
  using BuiltState = std::vector<std::unique_ptr<torch::optim::OptimizerParamState>>;

  PartitionedOptimizer* partitioned() override { return this; }
  /// Checkpoints: every parameter's state, whole and shaped like it ((key, tensor) as
  /// zero::state_tensors gives them). Collective; every rank gets all of it. Parameters without
  /// state yet are left out.
  virtual std::vector<std::pair<at::Tensor, NamedState>> gather_state() = 0;
  /// Checkpoints: this rank's pieces' state built from each parameter's staged state (`state_of`,
  /// null when none: whole, or, for FsdpOptimizer, only this rank's rows), checked but not
  /// installed (throws tandem::Error).
  virtual BuiltState build_state(const StateOf& state_of) const = 0;
  /// Replaces the pieces' state by what build_state made (does not throw for its result).
  virtual void install_state(BuiltState built) = 0;
  /// Clipping: this rank's pieces of `param`'s gradient (possibly none), views of what step()
  /// reads; nullopt when `param` is none of this optimizer's.
  virtual std::optional<std::vector<at::Tensor>> gradient_pieces(const at::Tensor& param) const = 0;

  // StateLayout::ByRows only (FSDP): the rows each rank holds.
  /// One tensor of this rank's optimizer state: rows [first_row, first_row + rows.size(0)) of the
  /// state `key` of `param`, whose whole shape is `whole_shape` ("step": whole, 0-d).
  struct OwnedState {
    at::Tensor param;
    std::string key;
    at::Tensor rows;
    int64_t first_row = 0;
    std::vector<int64_t> whole_shape;
  };
  /// The rows of one parameter this rank holds, and their dtype and device.
  struct HeldRows {
    std::vector<int64_t> shape;  // the parameter's whole shape
    at::TensorOptions options;
    int64_t first_row = 0, count = 0;
  };
  /// This rank's rows of every parameter's state. No collective: what a sharded checkpoint writes.
  virtual std::vector<OwnedState> owned_state() const { return {}; }
  /// The rows of `param` this rank holds.
  virtual HeldRows held_rows(const at::Tensor& param) const {
    (void)param;
    return {};
  }
};

}  // namespace tandem::zero
