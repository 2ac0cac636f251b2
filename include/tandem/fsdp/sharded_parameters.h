#pragma once
// ShardedParameters: what the rest of the library reads of an FSDP root's shards (its public face
// for the Accelerator's layouts, checkpoints and clipping, and for FsdpOptimizer), without its
// schedule. FullyShardedDataParallel::sharded_parameters() gives it.
//
//   auto shards = model->sharded_parameters();
//   auto spec = shards->spec_of(param);           // rows [first_row, first_row + owned_rows) are this rank's
//   at::Tensor mine = shards->shard_of(param);    // those rows, flat and padded to chunk_rows
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "tandem/comm/process_group.h"
#include "tandem/comm/shard_layout.h"

namespace tandem::fsdp {

/// How one parameter is cut (Note [Unit layout] in src/fsdp/unit_shard.h): rows [first_row,
/// first_row + owned_rows) of its `rows` are this rank's; each rank's chunk is chunk_rows long.
struct ShardSpec {
  std::vector<int64_t> shape;
  int64_t rows = 0, row_numel = 0, chunk_rows = 0, first_row = 0, owned_rows = 0;
  /// The shape of this rank's rows: [owned_rows, shape[1:]...] (a 0-d parameter is one row: [owned_rows]).
  std::vector<int64_t> owned_shape() const { return comm::rows_shape(shape, owned_rows); }
};

class ShardedParameters {
 public:
  virtual ~ShardedParameters() = default;
  /// Each parameter's shard (its owned rows), under the parameter's name, in the root's order: the
  /// optimizer's parameters.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_shards() const = 0;
  /// The shard of one of the root's parameters (undefined when it is not one).
  virtual at::Tensor shard_of(const at::Tensor& parameter) const = 0;
  /// How a parameter of the root is cut (nullopt when it is not one).
  virtual std::optional<ShardSpec> spec_of(const at::Tensor& parameter) const = 0;
  /// Sets the shard of every parameter named in `rows` from this rank's rows of it ([owned_rows,
  /// shape[1:]...] as spec_of gives them). Names it does not know are ignored.
  virtual void load_shards(const std::vector<std::pair<std::string, at::Tensor>>& rows) = 0;
  /// torch.nn.utils.clip_grad_norm_ over `parameters` (the root's, whole): their shards'
  /// gradients on every rank, each counted as often as given. Collective.
  virtual double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) = 0;
  /// The group the rows are cut over.
  virtual const std::shared_ptr<comm::ProcessGroup>& process_group() const = 0;
};

/// Whether any module under `root` is an fsdp::Unit (a model that chose its units itself needs
/// no auto-wrap policy).
bool has_units(torch::nn::Module& root);

}  // namespace tandem::fsdp
