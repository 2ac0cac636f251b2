#include "tandem/accelerate/consolidate.h"

#include <map>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "accelerate/sharded_tensors.h"
#include "accelerate/state_format.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/error.h"

namespace tandem::accelerate {

namespace {

nlohmann::json state_of(const CheckpointReader& reader, const std::string& where) {
  const auto state = nlohmann::json::parse(reader.read("state.json"));
  TANDEM_CHECK(state.value("format", 0) == kStateFormat && state.contains("optimizers"), where,
               ": state.json has no optimizer state by name (format ", state.value("format", 0),
               "; written by an older Tandem?)");
  return state;
}

/// Runs `body`, turning a state.json that is not what save_state writes into one line.
template <typename Body>
void with_state_errors(const std::string& where, Body body) {
  try {
    body();
  } catch (const nlohmann::json::exception& e) {
    throw Error(message(where, ": state.json is not what save_state writes (", e.what(), ")"));
  }
}

void consolidate(const std::string& checkpoint, size_t optimizer, const std::string& out, const std::string& where) {
  CheckpointReader reader(checkpoint);
  const auto state = state_of(reader, where);
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
  std::vector<std::string> paths;
  for (const auto& file : entry.at("files").get<std::vector<std::string>>()) paths.push_back(reader.path(file));
  const ShardedTensors shards(paths, where);  // every tensor's pieces tile it once
  std::vector<std::pair<std::string, at::Tensor>> merged;
  for (const auto& name : shards.names()) {
    const auto dot = name.rfind('.');
    const std::string file = shards.file_of(name);
    TANDEM_CHECK(dot != std::string::npos && params.count(name.substr(0, dot)), where, ": ",
                 file.substr(file.rfind('/') + 1), " holds '", name, "', which names no parameter of optimizer ",
                 optimizer);
    merged.emplace_back(name, shards.whole(name));
  }
  save_safetensors(out, merged,
                   {{"format", "pt"}, {"optimizer", type}, {"param_groups", entry.at("param_groups").dump()}});
}

}  // namespace

void consolidate_optimizer(const std::string& checkpoint, size_t optimizer, const std::string& out) {
  const std::string where = "consolidate " + checkpoint;
  with_state_errors(where, [&] { consolidate(checkpoint, optimizer, out, where); });
}

void consolidate_model(const std::string& checkpoint, size_t model, const std::string& out) {
  const std::string where = "consolidate " + checkpoint;
  with_state_errors(where, [&] {
    CheckpointReader reader(checkpoint);
    const auto state = state_of(reader, where);
    const auto models = state.at("models").get<size_t>();
    TANDEM_CHECK(model < models, where, " holds ", models, " model(s); there is no model ", model);
    std::vector<std::string> paths;
    for (const auto& file : model_files(state, model)) paths.push_back(reader.path(file));
    const ShardedTensors shards(paths, where);
    std::vector<std::pair<std::string, at::Tensor>> whole;
    for (const auto& name : shards.names()) whole.emplace_back(name, shards.whole(name));
    save_safetensors(out, whole, {{"format", "pt"}});
  });
}

}  // namespace tandem::accelerate
