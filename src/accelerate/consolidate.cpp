#include "tandem/accelerate/consolidate.h"

#include <map>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/error.h"

namespace tandem::accelerate {

namespace {

void consolidate(const std::string& checkpoint, size_t optimizer, const std::string& out, const std::string& where) {
  CheckpointReader reader(checkpoint);
  const auto state = nlohmann::json::parse(reader.read("state.json"));
  TANDEM_CHECK(state.value("format", 0) == 2 && state.contains("optimizers"), where,
               ": state.json has no optimizer state by name (format ", state.value("format", 0),
               "; written by an older Tandem?)");
  const auto& optimizers = state.at("optimizers");
  TANDEM_CHECK(optimizer < optimizers.size(), where, " holds ", optimizers.size(), " optimizer(s); there is no optimizer ",
               optimizer);
  const auto& entry = optimizers[optimizer];
  const std::string type = entry.at("type").get<std::string>();
  TANDEM_CHECK(!type.empty(), where, ": optimizer ", optimizer,
               " is of a type without a named format (saved as LibTorch archives), nothing to consolidate");
  std::set<std::string> params;
  for (const auto& group : entry.at("param_groups")) {
    for (const auto& name : group.at("params")) params.insert(name.get<std::string>());
  }
  std::vector<std::pair<std::string, at::Tensor>> merged;
  std::map<std::string, std::string> file_of;
  for (const auto& file : entry.at("files").get<std::vector<std::string>>()) {
    auto shard = load_safetensors(reader.path(file));
    for (auto& [name, tensor] : shard.tensors) {
      const auto dot = name.rfind('.');
      TANDEM_CHECK(dot != std::string::npos && params.count(name.substr(0, dot)), where, ": ", file, " holds '", name,
                   "', which names no parameter of optimizer ", optimizer);
      auto [it, fresh] = file_of.emplace(name, file);
      TANDEM_CHECK(fresh, where, ": '", name, "' is in both ", it->second, " and ", file);
      merged.emplace_back(name, std::move(tensor));
    }
  }
  save_safetensors(out, merged,
                   {{"format", "pt"}, {"optimizer", type}, {"param_groups", entry.at("param_groups").dump()}});
}

}  // namespace

void consolidate_optimizer(const std::string& checkpoint, size_t optimizer, const std::string& out) {
  const std::string where = "consolidate " + checkpoint;
  try {
    consolidate(checkpoint, optimizer, out, where);
  } catch (const nlohmann::json::exception& e) {
    throw Error(message(where, ": state.json is not what save_state writes (", e.what(), ")"));
  }
}

}  // namespace tandem::accelerate
