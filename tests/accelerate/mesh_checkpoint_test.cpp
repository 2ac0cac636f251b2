// A save on one device mesh loads on any other (issue 32, part 4), with real meshes: each process
// of a 4-process job writes its boxes on a 2 x 2 DeviceMesh (Note [Sharded files]); then every
// process reads, on 1 x 4 and 4 x 1 meshes and alone, the box its placements there give it, and
// it equals the same box of the whole tensor, which every process can make (a fixed seed).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "accelerate/sharded_tensors.h"
#include "support/distributed_main.h"
#include "tandem/comm/device_mesh.h"
#include "tandem/comm/placement.h"

namespace {

using tandem::comm::DeviceMesh;
using P = tandem::comm::Placement;
namespace acc = tandem::accelerate;

std::vector<std::pair<std::string, at::Tensor>> model() {
  at::manual_seed(3);
  return {{"attn.weight", at::randn({7, 5})},
          {"embed.weight", at::randn({9, 6}).to(at::kBFloat16)},
          {"norm.weight", at::randn({5}, at::kDouble)},
          {"scale", at::randn({})}};
}

using Placements = std::map<std::string, std::vector<P>>;

std::string shared_folder() { return tandem::test::shared_temp_folder("tandem-mesh-ckpt"); }

// This process's pieces on `mesh`, written to <folder>/model.rank<r>.safetensors (what it writes:
// comm::writes_chunk; the bytes as save_state makes them).
void save(const std::string& folder, const DeviceMesh& mesh, const Placements& placements) {
  std::vector<acc::ChunkPiece> pieces;
  for (const auto& [name, t] : model()) {
    const auto box = tandem::comm::local_chunk(t.sizes().vec(), mesh, placements.at(name));
    if (!tandem::comm::writes_chunk(mesh.coordinate(), placements.at(name), name) || box.numel() == 0) continue;
    pieces.push_back({name, tandem::comm::narrow_to(t, box).contiguous(), box.offsets, t.sizes().vec()});
  }
  std::ofstream(folder + "/model.rank" + std::to_string(tandem::test::pg().rank()) + ".safetensors", std::ios::binary)
      << acc::chunk_pieces_bytes(pieces);
}

TEST(MeshCheckpoint, ASaveOn2x2LoadsOn1x4And4x1AndAlone) {
  auto pg = tandem::test::shared_pg();
  if (pg->size() != 4) GTEST_SKIP() << "needs 4 processes, has " << pg->size();
  const auto R = P::replicate();
  auto S = [](int64_t d) { return P::shard(d); };
  const std::string folder = shared_folder();
  ASSERT_FALSE(folder.empty()) << "rank 0 could not make a folder";

  DeviceMesh saved(pg, {2, 2}, {"fsdp", "tp"});
  save(folder, saved,
       {{"attn.weight", {S(0), S(1)}}, {"embed.weight", {S(1), S(0)}}, {"norm.weight", {R, S(0)}}, {"scale", {R, R}}});
  pg->barrier();

  std::vector<std::string> files;
  for (int r = 0; r < 4; ++r) files.push_back(folder + "/model.rank" + std::to_string(r) + ".safetensors");
  const acc::ShardedTensors set(files, "load");
  struct Load {
    std::vector<int64_t> shape;
    Placements placements;
  };
  const std::vector<Load> loads{
      {{1, 4}, {{"attn.weight", {R, S(1)}}, {"embed.weight", {S(0), S(0)}}, {"norm.weight", {R, S(0)}}, {"scale", {R, R}}}},
      {{4, 1}, {{"attn.weight", {S(0), R}}, {"embed.weight", {S(1), S(0)}}, {"norm.weight", {S(0), R}}, {"scale", {R, R}}}},
  };
  for (const auto& load : loads) {
    DeviceMesh mesh(pg, load.shape, {"a", "b"});
    for (const auto& [name, t] : model()) {
      const auto box = tandem::comm::local_chunk(t.sizes().vec(), mesh, load.placements.at(name));
      EXPECT_TRUE(at::equal(set.chunk(name, box.offsets, box.sizes), tandem::comm::narrow_to(t, box)))
          << name << " on " << mesh.describe();
    }
  }
  for (const auto& [name, t] : model()) EXPECT_TRUE(at::equal(set.whole(name), t)) << name << " whole";

  pg->barrier();  // every process has read before rank 0 removes the files
  if (pg->rank() == 0) std::filesystem::remove_all(folder);
}

}  // namespace

int main(int argc, char** argv) { return tandem::test::distributed_test_main(argc, argv); }
