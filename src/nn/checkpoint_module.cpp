#include "tandem/nn/checkpoint_module.h"

#include "tandem/error.h"

namespace tandem::nn {

CheckpointImpl::CheckpointImpl(torch::nn::AnyModule module, CheckpointOptions options)
    : Wrapper("tandem::nn::Checkpoint", std::move(module)), options_(std::move(options)) {
  TANDEM_CHECK(!dynamic_cast<CheckpointImpl*>(module_.get()), "nn::Checkpoint: '", module_->name(),
               "' is checkpointed already: wrap a module once");
  TANDEM_CHECK(!dynamic_cast<Checkpointable*>(module_.get()), "nn::Checkpoint: '", module_->name(),
               "' checkpoints itself (a tandem::fsdp::Unit): call set_activation_checkpointing(true) on it instead "
               "of wrapping it, so that its gathers stay outside the recompute");
  options_.parameters({});
}

}  // namespace tandem::nn
