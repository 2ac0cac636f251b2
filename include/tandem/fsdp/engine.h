#pragma once
// The part of FullyShardedDataParallel that does not depend on the wrapped module's type: its
// units' sharded storage and the schedule of gathers, frees and reduce-scatters (Note [FSDP
// schedule] in engine.cpp). Programs use FullyShardedDataParallel (fully_sharded_data_parallel.h).
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "tandem/comm/process_group.h"
#include "tandem/comm/shard_layout.h"
#include "tandem/fsdp/options.h"
#include "tandem/fsdp/sharded_parameters.h"

namespace tandem::fsdp {

/// What one rank holds of the model's state, in bytes, counted from the tensors (not RSS).
struct MemoryBytes {
  int64_t parameter_shards = 0;   // at rest: this rank's shards, padding included
  int64_t gathered = 0;           // whole parameters of units gathered now
  int64_t gradient_shards = 0;    // the shards' gradients
  int64_t full_gradients = 0;     // whole gradients on the parameters (accumulation under no_sync)
  /// The most gathered parameters and whole gradients held at once since the last reset_peak():
  /// what a step adds to the state at rest.
  int64_t peak_transient = 0;
  /// The two largest units' parameters, whole: the transient bound with prefetching.
  int64_t two_largest_units = 0;
};

/// Host seconds spent blocked on FSDP's collectives since the engine was made (Note [Exposed
/// communication] in src/fsdp/engine.cpp): the communication that compute did not hide. On CUDA
/// waits are stream-ordered and do not block the host, so there these stay near 0.
struct CommWaits {
  double all_gather_s = 0;
  double reduce_scatter_s = 0;
};

/// One sharding unit, as the engine sees it.
struct UnitInfo {
  std::string name;               // its path in the root ("" for the root's own parameters)
  int64_t numel = 0;              // elements of its parameters, whole
  int64_t shard_numel = 0;        // elements of one rank's shards, padding included
  int64_t gathers = 0;            // all-gathers of its parameters since wrapping (forward, backward, prefetch)
};

namespace detail {

class Engine : public ShardedParameters, public std::enable_shared_from_this<Engine> {
 public:
  /// Finds the root's units, shards their parameters and those of no unit (the root unit).
  static std::shared_ptr<Engine> create(torch::nn::Module& root, std::shared_ptr<comm::ProcessGroup> pg,
                                        FullyShardOptions options);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void root_pre_forward();
  void root_post_forward(const std::vector<at::Tensor>& outputs, bool complete);
  /// Rethrows a failure of the root's forward, as one line that names the units not gathered then.
  [[noreturn]] void forward_failed(std::exception_ptr error);
  void unit_pre_forward(size_t unit);
  void unit_post_forward(size_t unit, const std::vector<at::Tensor>& outputs, bool complete);

  bool sync() const;
  void set_sync(bool enabled);
  /// Makes the next backward reduce-scatter, whatever its forward decided (Note [Several forwards
  /// in flight] in engine.cpp).
  void prepare_for_backward();

  /// The optimizer's parameters: each parameter's shard (its owned rows), under the parameter's
  /// name, in the root's order.
  std::vector<std::pair<std::string, at::Tensor>> named_shards() const override;
  /// The shard of one of the root's parameters (undefined when it is not one).
  at::Tensor shard_of(const at::Tensor& parameter) const override;
  /// How a parameter of the root is cut (nullopt when it is not one).
  std::optional<ShardSpec> spec_of(const at::Tensor& parameter) const override;
  /// Every parameter whole (copies), under every name the root gives it. Collective.
  std::vector<std::pair<std::string, at::Tensor>> gather_parameters();
  /// Sets the shard of every parameter named in `rows` from this rank's rows of it ([owned_rows,
  /// shape[1:]...] as spec_of gives them, checked by the caller). Names it does not know are ignored.
  void load_shards(const std::vector<std::pair<std::string, at::Tensor>>& rows) override;
  /// torch.nn.utils.clip_grad_norm_ over the shards' gradients of every rank. Collective.
  double clip_grad_norm(double max_norm, double norm_type);
  /// The same over `parameters` (the root's, whole) only: their shards' gradients, once per time
  /// each is given, as torch counts them. Throws tandem::Error for a tensor that is no parameter
  /// of the root. Collective: every rank gives the same parameters.
  double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) override;
  MemoryBytes memory() const;
  void reset_peak();
  CommWaits comm_waits() const;
  std::vector<UnitInfo> units() const;
  /// What the forwards' floating-point tensor arguments and outputs are cast to (mixed precision;
  /// nullopt: left alone).
  std::optional<at::ScalarType> input_dtype() const;
  std::optional<at::ScalarType> output_dtype() const;
  const std::shared_ptr<comm::ProcessGroup>& process_group() const override;

  // The autograd side (engine.cpp's hooks).
  void pre_backward(size_t unit);
  void on_gradient(size_t unit);
  void end_of_backward();
  /// A forward whose backward never ran or never ended: in-flight reduce-scatters are waited for
  /// and dropped, as are the parameters' whole gradients of a started backward; every unit freed.
  /// A started backward raised: first the ranks agree on the collectives it launched (Note [Failed
  /// backward]); throws tandem::Error on a rank whose partners did not fail too, or ran another graph.
  void abandon_backward();

 private:
  Engine();
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace detail
}  // namespace tandem::fsdp
