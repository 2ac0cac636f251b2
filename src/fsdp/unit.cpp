#include "tandem/fsdp/unit.h"

#include "tandem/error.h"

namespace tandem::fsdp {

UnitImpl::UnitImpl(torch::nn::AnyModule module) : nn::Wrapper("tandem::fsdp::Unit", std::move(module)) {
  TANDEM_CHECK(!dynamic_cast<UnitImpl*>(module_.get()), "fsdp: '", module_->name(),
               "' is a Unit already: wrap a module once");
}

void UnitImpl::attach(std::weak_ptr<detail::Engine> engine, size_t index) {
  engine_ = std::move(engine);
  index_ = index;
}

}  // namespace tandem::fsdp
