// The C++ side of the chunks interop test (chunks_interop.py drives it and judges with PyTorch):
//   boxes                   reads cases [{"shape", "mesh", "placements": ["S0", "R", "P", ...]}]
//                           on stdin; prints, for each, every coordinate's (row-major)
//                           [offsets, sizes] by comm::local_chunk, as JSON
//   write-checkpoint <root> commits <root>/checkpoint_000007: a model saved on a 2 x 2 mesh, each
//                           coordinate's boxes in model_0.rank<r>.safetensors (Note [Sharded
//                           files]), and writes <root>/expected.safetensors: the whole tensors,
//                           as `tandem checkpoint consolidate --model 0` must write them
#include <cstdio>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "accelerate/sharded_tensors.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/comm/placement.h"
#include "tandem/error.h"

namespace {

using tandem::comm::Placement;

Placement parse(const std::string& text) {
  if (text == "R") return Placement::replicate();
  if (text == "P") return Placement::partial();
  TANDEM_CHECK(text.size() > 1 && text[0] == 'S', "chunks_interop_tool: placement '", text, "' is not S<d>, R or P");
  return Placement::shard(std::stoll(text.substr(1)));
}

std::vector<std::vector<int64_t>> every_coordinate(const std::vector<int64_t>& mesh) {
  std::vector<std::vector<int64_t>> out{{}};
  for (int64_t size : mesh) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& c : out) {
      for (int64_t i = 0; i < size; ++i) {
        next.push_back(c);
        next.back().push_back(i);
      }
    }
    out = next;
  }
  return out;
}

int boxes() {
  const auto cases = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(std::cin), {}));
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : cases) {
    std::vector<Placement> placements;
    for (const auto& p : c.at("placements")) placements.push_back(parse(p.get<std::string>()));
    const auto shape = c.at("shape").get<std::vector<int64_t>>();
    const auto mesh = c.at("mesh").get<std::vector<int64_t>>();
    nlohmann::json each = nlohmann::json::array();
    for (const auto& coordinate : every_coordinate(mesh)) {
      const auto box = tandem::comm::local_chunk(shape, mesh, coordinate, placements);
      each.push_back({box.offsets, box.sizes});
    }
    out.push_back(each);
  }
  std::cout << out.dump() << "\n";
  return 0;
}

int write_checkpoint(const std::string& root) {
  namespace acc = tandem::accelerate;
  at::manual_seed(5);
  // By name (consolidate's order), with placements on a 2 x 2 mesh as TP x FSDP would make them.
  const std::vector<std::pair<std::string, at::Tensor>> whole{
      {"attn.bias", at::randn({6})},
      {"attn.weight", at::randn({6, 5})},
      {"embed.weight", at::randn({11, 4}).to(at::kBFloat16)},
      {"mlp.weight", at::randn({7, 9}, at::kDouble)},
      {"norm.eps", at::randn({})},
      {"steps", at::arange(5, at::kLong)},
  };
  const auto R = Placement::replicate();
  auto S = [](int64_t d) { return Placement::shard(d); };
  const std::map<std::string, std::vector<Placement>> placements{
      {"attn.bias", {R, S(0)}},        {"attn.weight", {S(0), S(1)}}, {"embed.weight", {S(1), S(0)}},
      {"mlp.weight", {S(1), S(1)}},    {"norm.eps", {R, R}},          {"steps", {S(0), R}}};
  const std::vector<int64_t> mesh{2, 2};
  acc::CheckpointWriter writer(root, acc::checkpoint_name(7));
  nlohmann::json files = nlohmann::json::array();
  const auto coordinates = every_coordinate(mesh);
  for (size_t r = 0; r < coordinates.size(); ++r) {
    std::vector<acc::ChunkPiece> pieces;
    for (const auto& [name, t] : whole) {
      const auto box = tandem::comm::local_chunk(t.sizes().vec(), mesh, coordinates[r], placements.at(name));
      if (!tandem::comm::writes_chunk(coordinates[r], placements.at(name), name) || box.numel() == 0) continue;
      pieces.push_back({name, tandem::comm::narrow_to(t, box).contiguous(), box.offsets, t.sizes().vec()});
    }
    const std::string file = "model_0.rank" + std::to_string(r) + ".safetensors";
    writer.add_file(file, acc::chunk_pieces_bytes(pieces));
    files.push_back(file);
  }
  const nlohmann::json state{{"format", 2},      {"models", 1},        {"model_files", {files}},
                             {"optimizers", {}}, {"completed_steps", 7}, {"world_size", 4}};
  writer.add_file("state.json", state.dump(2) + "\n");
  std::printf("%s\n", writer.commit().c_str());
  acc::save_safetensors(root + "/expected.safetensors", whole, {{"format", "pt"}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "boxes" && argc == 2) return boxes();
    if (mode == "write-checkpoint" && argc == 3) return write_checkpoint(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", tandem::one_line(e).c_str());
    return 1;
  }
  std::fprintf(stderr, "usage: %s boxes < cases.json | write-checkpoint ROOT\n", argv[0]);
  return 2;
}
