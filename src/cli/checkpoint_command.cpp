// `tandem checkpoint info DIR` and `tandem checkpoint consolidate DIR --out FILE`: what a
// checkpoint of the Accelerator holds, and its optimizer state in one file (docs/checkpoints.md).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/consolidate.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/error.h"

namespace tandem::cli {
namespace {

// The checkpoint folder itself, or the newest under a root (as load_state takes either).
std::string checkpoint_in(const std::string& path) {
  const auto found = accelerate::list_checkpoints(path);
  return found.empty() ? path : found.back();
}

nlohmann::json state_of(const accelerate::CheckpointReader& reader) {
  try {
    return nlohmann::json::parse(reader.read("state.json"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(message("checkpoint ", reader.dir(), ": state.json is not what save_state writes (", e.what(), ")"));
  }
}

int info(const std::string& path) {
  accelerate::CheckpointReader reader(checkpoint_in(path));  // verifies every file
  const auto state = state_of(reader);
  try {
    std::printf("checkpoint   %s (written %s, every file verified)\n", reader.dir().c_str(), reader.created().c_str());
    std::printf("step         %lld, saved by %d process(es)\n",
                static_cast<long long>(state.at("completed_steps").get<int64_t>()), state.at("world_size").get<int>());
    for (size_t m = 0; m < state.at("models").get<size_t>(); ++m) {
      const auto file = "model_" + std::to_string(m) + ".safetensors";
      auto weights = accelerate::load_safetensors(reader.path(file));
      int64_t numel = 0;
      for (const auto& [name, t] : weights.tensors) numel += t.numel();
      std::printf("model %zu      %s: %zu tensors, %lld elements\n", m, file.c_str(), weights.tensors.size(),
                  static_cast<long long>(numel));
    }
    const auto& optimizers = state.at("optimizers");
    for (size_t o = 0; o < optimizers.size(); ++o) {
      const auto& entry = optimizers[o];
      const auto type = entry.at("type").get<std::string>();
      const auto files = entry.at("files").get<std::vector<std::string>>();
      std::printf("optimizer %zu  %s, %s, %zu file(s)%s\n", o, type.empty() ? "(LibTorch archive)" : type.c_str(),
                  entry.at("sharded").get<bool>() ? "sharded (ZeRO)" : "whole", files.size(),
                  type.empty() ? ": loads only at the world size and sharding it was saved with" : ": loads at any world size");
      if (!type.empty()) {
        const auto& groups = entry.at("param_groups");
        for (size_t g = 0; g < groups.size(); ++g) {
          std::printf("  group %zu    %zu parameters, %s\n", g, groups[g].at("params").size(),
                      groups[g].at("options").dump().c_str());
        }
      }
    }
    const auto& loaders = state.at("loaders");
    for (size_t l = 0; l < loaders.size(); ++l) {
      std::printf("loader %zu     epoch %lld, %lld samples of it consumed\n", l,
                  static_cast<long long>(loaders[l].at("epoch").get<int64_t>()),
                  static_cast<long long>(loaders[l].at("samples_done").get<int64_t>()));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(message("checkpoint ", reader.dir(), ": state.json is not what save_state writes (", e.what(), ")"));
  }
  return 0;
}

}  // namespace

Command add_checkpoint_command(CLI::App& app) {
  auto* sub = app.add_subcommand("checkpoint", "Inspect an Accelerator checkpoint, or consolidate its optimizer state");
  sub->require_subcommand(1);
  auto path = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto optimizer = std::make_shared<size_t>(0);
  auto* info_cmd = sub->add_subcommand("info", "What the checkpoint holds (files verified against its manifest)");
  info_cmd->add_option("dir", *path, "a checkpoint folder, or a root of checkpoint_<step> folders (the newest)")
      ->required();
  auto* consolidate = sub->add_subcommand(
      "consolidate", "One safetensors file of an optimizer's state (every shard, by parameter name)");
  consolidate->add_option("dir", *path, "a checkpoint folder, or a root of checkpoint_<step> folders (the newest)")
      ->required();
  consolidate->add_option("--out", *out, "the file to write")->required();
  consolidate->add_option("--optimizer", *optimizer, "which prepared optimizer (default 0)");
  return [=]() {
    if (info_cmd->parsed()) return info(*path);
    const std::string dir = checkpoint_in(*path);
    accelerate::consolidate_optimizer(dir, *optimizer, *out);
    std::printf("%s: optimizer %zu of %s\n", out->c_str(), *optimizer, dir.c_str());
    return 0;
  };
}

}  // namespace tandem::cli
