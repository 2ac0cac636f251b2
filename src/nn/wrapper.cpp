#include "tandem/nn/wrapper.h"

#include "tandem/error.h"

namespace tandem::nn {

Wrapper::Wrapper(std::string label, torch::nn::AnyModule module)
    : torch::nn::Module(std::move(label)), inner_(std::move(module)) {
  TANDEM_CHECK(!inner_.is_empty(), name(), ": needs a module");
  module_ = inner_.ptr();
  for (const auto& item : module_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
  for (const auto& item : module_->named_children()) register_module(item.key(), item.value());
}

void Wrapper::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

void Wrapper::pretty_print(std::ostream& stream) const {
  stream << name() << "(";
  module_->pretty_print(stream);
  stream << ")";
}

}  // namespace tandem::nn
