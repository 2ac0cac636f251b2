// `tandem checkpoint info DIR` and `tandem checkpoint consolidate DIR --out FILE`: what a
// checkpoint of the Accelerator holds, and its optimizer state or its weights in one file
// (docs/checkpoints.md).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "accelerate/sharded_tensors.h"
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
      const auto files = accelerate::model_files(state, m);
      std::vector<std::string> paths;
      for (const auto& f : files) paths.push_back(reader.path(f));
      const accelerate::ShardedTensors weights(paths, "checkpoint " + reader.dir());  // headers only
      int64_t numel = 0;
      for (const auto& name : weights.names()) {
        int64_t n = 1;
        for (int64_t d : weights.shape(name)) n *= d;
        numel += n;
      }
      const std::string where =
          files.size() == 1 ? files[0]
                            : message("model_", m, ".rank*.safetensors, sharded in ", files.size(), " files");
      std::printf("model %zu      %s: %zu tensors, %lld elements\n", m, where.c_str(), weights.names().size(),
                  static_cast<long long>(numel));
    }
    const auto& optimizers = state.at("optimizers");
    for (size_t o = 0; o < optimizers.size(); ++o) {
      const auto& entry = optimizers[o];
      const auto type = entry.at("type").get<std::string>();
      const auto files = entry.at("files").get<std::vector<std::string>>();
      std::printf("optimizer %zu  %s, %s, %zu file(s)%s\n", o, type.empty() ? "(LibTorch archive)" : type.c_str(),
                  entry.at("sharded").get<bool>() ? "sharded" : "whole", files.size(),
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
  auto model = std::make_shared<size_t>(0);
  auto* info_cmd = sub->add_subcommand("info", "What the checkpoint holds (files verified against its manifest)");
  info_cmd->add_option("dir", *path, "a checkpoint folder, or a root of checkpoint_<step> folders (the newest)")
      ->required();
  auto* consolidate = sub->add_subcommand(
      "consolidate",
      "One safetensors file of an optimizer's state (every shard, by parameter name), or with --model of the weights "
      "(a plain state dict)");
  consolidate->add_option("dir", *path, "a checkpoint folder, or a root of checkpoint_<step> folders (the newest)")
      ->required();
  consolidate->add_option("--out", *out, "the file to write")->required();
  auto* optimizer_opt = consolidate->add_option("--optimizer", *optimizer, "which prepared optimizer (default 0)");
  auto* model_opt = consolidate->add_option("--model", *model, "the weights of this prepared model instead");
  model_opt->excludes(optimizer_opt);
  return [=]() {
    if (info_cmd->parsed()) return info(*path);
    const std::string dir = checkpoint_in(*path);
    if (model_opt->count() > 0) {
      accelerate::consolidate_model(dir, *model, *out);
      std::printf("%s: model %zu of %s\n", out->c_str(), *model, dir.c_str());
      return 0;
    }
    accelerate::consolidate_optimizer(dir, *optimizer, *out);
    std::printf("%s: optimizer %zu of %s\n", out->c_str(), *optimizer, dir.c_str());
    return 0;
  };
}

}  // namespace tandem::cli
