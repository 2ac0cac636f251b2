#include "tandem/nn/hookable.h"

namespace tandem::nn {

HookableImpl::HookableImpl(torch::nn::AnyModule module) : Wrapper("tandem::nn::Hookable", std::move(module)) {
  TANDEM_CHECK(!dynamic_cast<HookableImpl*>(module_.get()), "nn::Hookable: '", module_->name(),
               "' is Hookable already: wrap a module once");
}

}  // namespace tandem::nn
