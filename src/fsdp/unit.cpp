#include "tandem/fsdp/unit.h"

#include <ostream>

#include "tandem/error.h"

namespace tandem::fsdp {

UnitImpl::UnitImpl(torch::nn::AnyModule module) : torch::nn::Module("tandem::fsdp::Unit"), inner_(std::move(module)) {
  TANDEM_CHECK(!inner_.is_empty(), "fsdp: a Unit needs a module");
  module_ = inner_.ptr();
  TANDEM_CHECK(!dynamic_cast<UnitImpl*>(module_.get()), "fsdp: '", module_->name(),
               "' is a Unit already: wrap a module once");
  // Adopt the module's own tensors and children under their names: the model's parameter names
  // stay what they were (no ".module." level), so checkpoints read the same under DDP and FSDP.
  for (const auto& item : module_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
  for (const auto& item : module_->named_children()) register_module(item.key(), item.value());
}

void UnitImpl::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);  // the wrapped module is not our child; its own flag matters to it
}

void UnitImpl::pretty_print(std::ostream& stream) const {
  stream << "tandem::fsdp::Unit(";
  module_->pretty_print(stream);
  stream << ")";
}

void UnitImpl::attach(std::weak_ptr<detail::Engine> engine, size_t index) {
  engine_ = std::move(engine);
  index_ = index;
}

}  // namespace tandem::fsdp
