#pragma once
// tandem::nn::Wrapper: the base of the modules that run code around another module's forward
// (tandem::fsdp::Unit, tandem::nn::Checkpoint, tandem::nn::Hookable). LibTorch modules have no
// forward hooks, so such code lives in a module placed in the tree where the model calls it.
//
// A wrapper adopts the wrapped module's parameters, buffers and children under their own names:
// the model's parameter names do not change (no ".module." level), so a checkpoint reads the same
// whatever wraps what.
#include <memory>
#include <ostream>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

namespace tandem::nn {

class Wrapper : public torch::nn::Module {
 public:
  /// The wrapped module.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  /// Sets the wrapped module's flag too: it is not our child, and its own flag matters to it.
  void train(bool on = true) override;
  /// "<label>(<the wrapped module>)".
  void pretty_print(std::ostream& stream) const override;

 protected:
  /// `label` is the module's name (Module::name()) and the prefix of its errors' first words.
  /// Throws tandem::Error for an empty module.
  Wrapper(std::string label, torch::nn::AnyModule module);

  torch::nn::AnyModule inner_;
  std::shared_ptr<torch::nn::Module> module_;
};

}  // namespace tandem::nn
