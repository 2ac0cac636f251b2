#include "tandem/nn/checkpoint_module.h"

#include <ostream>

#include "tandem/error.h"

namespace tandem::nn {

CheckpointImpl::CheckpointImpl(torch::nn::AnyModule module, CheckpointOptions options)
    : torch::nn::Module("tandem::nn::Checkpoint"), inner_(std::move(module)), options_(std::move(options)) {
  TANDEM_CHECK(!inner_.is_empty(), "nn::Checkpoint: needs a module");
  module_ = inner_.ptr();
  TANDEM_CHECK(!dynamic_cast<CheckpointImpl*>(module_.get()), "nn::Checkpoint: '", module_->name(),
               "' is checkpointed already: wrap a module once");
  TANDEM_CHECK(!dynamic_cast<Checkpointable*>(module_.get()), "nn::Checkpoint: '", module_->name(),
               "' checkpoints itself (a tandem::fsdp::Unit): call set_activation_checkpointing(true) on it instead "
               "of wrapping it, so that its gathers stay outside the recompute");
  options_.parameters({});
  // The wrapped module's own names, as tandem::fsdp::Unit adopts them: checkpoints read the same.
  for (const auto& item : module_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
  for (const auto& item : module_->named_children()) register_module(item.key(), item.value());
}

void CheckpointImpl::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);  // the wrapped module is not our child; its own flag matters to it (dropout)
}

void CheckpointImpl::pretty_print(std::ostream& stream) const {
  stream << "tandem::nn::Checkpoint(";
  module_->pretty_print(stream);
  stream << ")";
}

}  // namespace tandem::nn
