// Sharded safetensors files (Note [Sharded files]): any rows, and any box, of any tensor read from
// the pieces of any cut (FSDP's rows, any placement on any mesh) equal the same elements of the
// whole tensor; files of older Tandems (tandem_rows) still load; a set whose pieces do not tile
// every tensor exactly is refused with one line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "accelerate/sharded_tensors.h"
#include "support/errors.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/comm/placement.h"

namespace tandem::accelerate {
namespace {

namespace fs = std::filesystem;
using P = comm::Placement;

/// A mesh and every tensor's placements on it.
struct Layout {
  std::string label;
  std::vector<int64_t> mesh;
  std::map<std::string, std::vector<P>> placements;
};

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

class ShardedTensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tandem-rows-XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  /// `whole`'s rows cut as FSDP cuts them among `world` ranks (chunks of ceil(rows / world)), one
  /// file per rank; `extra` (whole tensors) go into rank 0's file.
  std::vector<std::string> cut(const std::string& prefix, const std::vector<std::pair<std::string, at::Tensor>>& whole,
                               int world, const std::vector<std::pair<std::string, at::Tensor>>& extra = {}) {
    std::vector<std::string> paths;
    for (int r = 0; r < world; ++r) {
      std::vector<ChunkPiece> pieces;
      for (const auto& [name, t] : whole) {
        const int64_t rows = t.dim() == 0 ? 1 : t.size(0), chunk = (rows + world - 1) / world;
        const int64_t first = std::min(rows, r * chunk), count = std::min(rows, first + chunk) - first;
        if (count == 0) continue;
        at::Tensor piece = t.dim() == 0 ? t.reshape({1}) : t.narrow(0, first, count);
        pieces.push_back(ChunkPiece::rows(name, piece, first, t.sizes().vec()));
      }
      if (r == 0) {
        for (const auto& [name, t] : extra) pieces.push_back(ChunkPiece::rows(name, t, 0, t.sizes().vec()));
      }
      paths.push_back(write(prefix + ".rank" + std::to_string(r) + ".safetensors", chunk_pieces_bytes(pieces)));
    }
    return paths;
  }
  /// `whole` placed on a mesh as `layout` says, one file per coordinate (row-major): each process
  /// writes its box of every tensor it writes (writes_chunk), and an empty box only at the origin
  /// (so a tensor of no elements is still named), as save_state does.
  std::vector<std::string> place(const std::string& prefix, const std::vector<std::pair<std::string, at::Tensor>>& whole,
                                 const Layout& layout) {
    std::vector<std::string> paths;
    const auto coordinates = every_coordinate(layout.mesh);
    for (size_t r = 0; r < coordinates.size(); ++r) {
      const auto& c = coordinates[r];
      const bool origin = std::all_of(c.begin(), c.end(), [](int64_t i) { return i == 0; });
      std::vector<ChunkPiece> pieces;
      for (const auto& [name, t] : whole) {
        const auto& placements = layout.placements.at(name);
        const auto box = comm::local_chunk(t.sizes().vec(), layout.mesh, c, placements);
        if (!comm::writes_chunk(c, placements, name) || (box.numel() == 0 && !origin)) continue;
        pieces.push_back({name, comm::narrow_to(t, box).contiguous(), box.offsets, t.sizes().vec()});
      }
      paths.push_back(write(prefix + ".rank" + std::to_string(r) + ".safetensors", chunk_pieces_bytes(pieces)));
    }
    return paths;
  }

  std::string dir_;
};

std::vector<std::pair<std::string, at::Tensor>> sample() {
  at::manual_seed(7);
  return {{"w", at::randn({10, 3})},
          {"b", at::randn({7})},
          {"h", at::randn({5, 2, 3}).to(at::kBFloat16)},
          {"s", at::randn({})},
          {"mask", at::rand({6, 2}) > 0.5}};
}

TEST_F(ShardedTensorsTest, AnyRowsOfAnyCutEqualTheWholeTensorsRows) {
  const auto whole = sample();
  const at::Tensor buffer = at::arange(4, at::kLong);
  for (int world : {1, 2, 3, 4, 8}) {
    const ShardedTensors set(cut("m" + std::to_string(world), whole, world, {{"buffer", buffer}}), "test");
    EXPECT_EQ(set.names(), (std::vector<std::string>{"b", "buffer", "h", "mask", "s", "w"}));
    EXPECT_TRUE(at::equal(set.whole("buffer"), buffer));
    for (const auto& [name, t] : whole) {
      EXPECT_EQ(set.shape(name), t.sizes().vec()) << name;
      EXPECT_EQ(set.dtype(name), t.scalar_type()) << name;
      EXPECT_TRUE(at::equal(set.whole(name), t)) << name << " at world " << world;
      const at::Tensor rows = t.dim() == 0 ? t.reshape({1}) : t;
      for (int64_t first = 0; first <= rows.size(0); ++first) {
        for (int64_t count = 0; first + count <= rows.size(0); ++count) {
          EXPECT_TRUE(at::equal(set.rows(name, first, count), rows.narrow(0, first, count)))
              << name << " rows " << first << "+" << count << " at world " << world;
        }
      }
    }
  }
}

TEST_F(ShardedTensorsTest, AWholeFileIsOnePiecePerTensor) {
  const auto whole = sample();
  save_safetensors(dir_ + "/whole.safetensors", whole);
  const ShardedTensors set({dir_ + "/whole.safetensors"}, "test");
  for (const auto& [name, t] : whole) EXPECT_TRUE(at::equal(set.whole(name), t)) << name;
  EXPECT_TRUE(at::equal(set.rows("w", 3, 4), whole[0].second.narrow(0, 3, 4)));
  // Rows of a whole file in one set with another model's rows: refused, never mixed.
  EXPECT_ERROR(ShardedTensors({dir_ + "/whole.safetensors", cut("x", {whole[0]}, 2)[1]}, "test"),
               "test: 'w' rows 5 to 10 are in both whole.safetensors and x.rank1.safetensors: the shards overlap "
               "(files of two checkpoints mixed?)");
}

// An empty tensor is empty whatever its other dimensions: their product may exceed int64.
TEST_F(ShardedTensorsTest, AnEmptyTensorWithHugeDimensionsLoads) {
  const std::vector<int64_t> whole{int64_t{1} << 40, int64_t{1} << 40, 0};
  const std::string path = write("empty.rank0.safetensors",
                                 chunk_pieces_bytes({{"e", at::zeros({1, 1, 0}), {0, 0, 0}, whole}}));
  const ShardedTensors set({path}, "test");
  EXPECT_EQ(set.shape("e"), whole);
  EXPECT_EQ(set.chunk("e", {5, 7, 0}, {1, 2, 0}).sizes(), (std::vector<int64_t>{1, 2, 0}));
}

TEST_F(ShardedTensorsTest, PiecesThatDoNotTileATensorAreRefused) {
  const auto whole = sample();
  const auto files = cut("m", whole, 3);
  EXPECT_ERROR(ShardedTensors({files[0], files[2]}, "load_state: ckpt"),
               "load_state: ckpt: 'b' rows 3 to 6 are in no file: a shard is missing");
  EXPECT_ERROR(ShardedTensors({files[0], files[1]}, "load_state: ckpt"),
               "load_state: ckpt: 'b' rows 6 to 7 are in no file: a shard is missing");
  EXPECT_ERROR(ShardedTensors({files[0], files[1], files[2], files[1]}, "load_state: ckpt"),
               "load_state: ckpt: 'b' rows 3 to 6 are in both m.rank1.safetensors and m.rank1.safetensors: the shards "
               "overlap (files of two checkpoints mixed?)");
  // Another cut of another dtype of the same name.
  const auto other = cut("o", {{"w", whole[0].second.to(at::kDouble)}}, 2);
  EXPECT_ERROR(ShardedTensors({files[0], other[1]}, "load_state: ckpt"),
               "load_state: ckpt: 'w' is Double[10, 3] in o.rank1.safetensors but Float[10, 3] in m.rank0.safetensors: "
               "files of two checkpoints mixed?");
  const ShardedTensors set(files, "load_state: ckpt");
  EXPECT_ERROR(set.rows("w", 8, 3), "load_state: ckpt: 'w' has 10 rows; rows 8 to 11 were asked for");
  EXPECT_ERROR(set.whole("v"), "load_state: ckpt: no tensor 'v'");
}

TEST_F(ShardedTensorsTest, RowsMetadataThatDisagreesWithTheFileIsRefused) {
  const at::Tensor t = at::zeros({4, 3});
  auto with = [&](const std::string& name, const std::string& rows) {
    return write(name, safetensors_bytes({{"w", t}}, {{"format", "pt"}, {kRowsMetadataKey, rows}}));
  };
  EXPECT_ERROR(ShardedTensors({with("a", "{")}, "t"), "t: a: its tandem_rows metadata is not valid JSON");
  EXPECT_ERROR(ShardedTensors({with("b", "[]")}, "t"), "t: b: its tandem_rows metadata is not a JSON object");
  EXPECT_ERROR(ShardedTensors({with("c", R"({"v": [0, [4, 3]]})")}, "t"),
               "t: c: tandem_rows names 'v', which the file does not hold");
  EXPECT_ERROR(ShardedTensors({with("d", R"({"w": [0, "x"]})")}, "t"),
               "t: d: the rows of 'w' are not [first row, [whole shape]]");
  EXPECT_ERROR(ShardedTensors({with("e", R"({"w": [0, [4, 2]]})")}, "t"),
               "t: e: 'w' is [4, 3] from row 0, which is not rows of a [4, 2] tensor");
  EXPECT_ERROR(ShardedTensors({with("f", R"({"w": [2, [5, 3]]})")}, "t"),
               "t: f: 'w' is [4, 3] from row 2, which is not rows of a [5, 3] tensor");
  // Numbers past int64 (JSON's unsigned 64-bit) or that overflow a sum: refused, never wrapped.
  EXPECT_ERROR(ShardedTensors({with("h", R"({"w": [18446744073709551615, [4, 3]]})")}, "t"),
               "t: h: the rows of 'w' are not [first row, [whole shape]]");
  EXPECT_ERROR(ShardedTensors({with("i", R"({"w": [9223372036854775807, [9223372036854775807, 3]]})")}, "t"),
               "t: i: 'w' is [4, 3] from row 9223372036854775807, which is not rows of a [9223372036854775807, 3] tensor");
  EXPECT_ERROR(ShardedTensors({with("g", R"({"w": [1, [5, 3]]})")}, "t"),
               "t: 'w' rows 0 to 1 are in no file: a shard is missing");
}

std::vector<std::pair<std::string, at::Tensor>> mesh_sample() {
  at::manual_seed(11);
  return {{"w", at::randn({7, 5})},
          {"e", at::randn({6, 4}).to(at::kBFloat16)},
          {"b", at::randn({5}, at::kDouble)},
          {"s", at::randn({})},
          {"z", at::zeros({0, 4})},
          {"mask", at::rand({4, 3}) > 0.5}};
}

// The layouts a save and a load may use: 2 x 2 as tensor parallelism x FSDP would place them,
// 1 x 4, 4 x 1, one process, and a 3-D mesh.
std::vector<Layout> layouts() {
  const auto R = P::replicate();
  auto S = [](int64_t d) { return P::shard(d); };
  return {
      {"2x2", {2, 2}, {{"w", {S(0), S(1)}}, {"e", {S(1), S(1)}}, {"b", {R, S(0)}}, {"s", {R, R}}, {"z", {S(1), S(0)}},
                       {"mask", {S(1), S(0)}}}},
      {"1x4", {1, 4}, {{"w", {R, S(1)}}, {"e", {S(0), S(0)}}, {"b", {S(0), R}}, {"s", {R, R}}, {"z", {R, S(1)}},
                       {"mask", {S(0), S(1)}}}},
      {"4x1", {4, 1}, {{"w", {S(0), S(1)}}, {"e", {S(1), R}}, {"b", {S(0), S(0)}}, {"s", {R, R}}, {"z", {S(0), R}},
                       {"mask", {S(0), R}}}},
      {"1", {1}, {{"w", {R}}, {"e", {R}}, {"b", {R}}, {"s", {R}}, {"z", {R}}, {"mask", {R}}}},
      {"2x1x2", {2, 1, 2}, {{"w", {S(1), R, S(0)}}, {"e", {S(0), S(1), S(-1)}}, {"b", {R, R, S(0)}}, {"s", {R, R, R}},
                            {"z", {S(0), S(1), R}}, {"mask", {S(0), S(0), S(1)}}}},
  };
}

TEST_F(ShardedTensorsTest, ASaveOnAnyMeshLoadsOnAnyOtherMesh) {
  const auto whole = mesh_sample();
  for (const auto& saved : layouts()) {
    const ShardedTensors set(place("save" + saved.label, whole, saved), "test");
    for (const auto& [name, t] : whole) {
      EXPECT_TRUE(at::equal(set.whole(name), t)) << name << " saved on " << saved.label;
      EXPECT_EQ(set.dtype(name), t.scalar_type()) << name;
    }
    for (const auto& loaded : layouts()) {
      for (const auto& c : every_coordinate(loaded.mesh)) {
        for (const auto& [name, t] : whole) {
          const auto box = comm::local_chunk(t.sizes().vec(), loaded.mesh, c, loaded.placements.at(name));
          EXPECT_TRUE(at::equal(set.chunk(name, box.offsets, box.sizes), comm::narrow_to(t, box)))
              << name << " saved on " << saved.label << ", loaded on " << loaded.label << " at "
              << c10::IntArrayRef(c);
        }
      }
    }
  }
}

TEST_F(ShardedTensorsTest, ChunksThatDoNotTileATensorAreRefused) {
  const auto whole = mesh_sample();
  const auto layout = layouts()[0];  // 2 x 2; w as (Shard(0), Shard(1)): [0:4, 0:3] [0:4, 3:5] [4:7, 0:3] [4:7, 3:5]
  const auto files = place("m", {whole[0]}, layout);
  EXPECT_ERROR(ShardedTensors({files[0], files[1], files[2]}, "load_state: ckpt"),
               "load_state: ckpt: 'w' elements [4:7, 3:5] are in no file: a shard is missing");
  EXPECT_ERROR(ShardedTensors({files[1], files[2], files[3]}, "load_state: ckpt"),
               "load_state: ckpt: 'w' elements [0:4, 0:3] are in no file: a shard is missing");
  // Another save's columns [0:7, 2:4] (1 x 4 as (Replicate, Shard(1))) beside this one's pieces.
  const auto other = place("o", {whole[0]}, layouts()[1]);
  EXPECT_ERROR(ShardedTensors({files[0], files[1], files[2], files[3], other[1]}, "load_state: ckpt"),
               "load_state: ckpt: 'w' elements [0:4, 2:3] are in both m.rank0.safetensors and o.rank1.safetensors: "
               "the shards overlap (files of two checkpoints mixed?)");
  const ShardedTensors set(files, "load_state: ckpt");
  EXPECT_ERROR(set.chunk("w", {6, 0}, {2, 2}), "load_state: ckpt: 'w' is [7, 5]; the box of [2, 2] at [6, 0] was asked for");
  EXPECT_ERROR(set.chunk("w", {0}, {2}), "load_state: ckpt: 'w' is [7, 5]; the box of [2] at [0] was asked for");
}

TEST_F(ShardedTensorsTest, ChunksMetadataThatDisagreesWithTheFileIsRefused) {
  const at::Tensor t = at::zeros({4, 3});
  auto with = [&](const std::string& name, const std::string& chunks, const std::string& rows = "") {
    std::map<std::string, std::string> metadata{{"format", "pt"}, {kChunksMetadataKey, chunks}};
    if (!rows.empty()) metadata[kRowsMetadataKey] = rows;
    return write(name, safetensors_bytes({{"w", t}}, metadata));
  };
  EXPECT_ERROR(ShardedTensors({with("a", "{")}, "t"), "t: a: its tandem_chunks metadata is not valid JSON");
  EXPECT_ERROR(ShardedTensors({with("b", R"({"v": [[0, 0], [4, 3]]})")}, "t"),
               "t: b: tandem_chunks names 'v', which the file does not hold");
  EXPECT_ERROR(ShardedTensors({with("c", R"({"w": [[0], 3]})")}, "t"),
               "t: c: the chunk of 'w' is not [[offsets], [whole shape]]");
  EXPECT_ERROR(ShardedTensors({with("d", R"({"w": [[0, -1], [4, 3]]})")}, "t"),
               "t: d: the chunk of 'w' is not [[offsets], [whole shape]]");
  EXPECT_ERROR(ShardedTensors({with("e", R"({"w": [[0, 1], [4, 3]]})")}, "t"),
               "t: e: 'w' is [4, 3] at [0, 1], which is not a box of a [4, 3] tensor");
  EXPECT_ERROR(ShardedTensors({with("f", R"({"w": [[0], [4, 3]]})")}, "t"),
               "t: f: 'w' is [4, 3] at [0], which is not a box of a [4, 3] tensor");
  EXPECT_ERROR(ShardedTensors({with("g", R"({"w": [[0, 0], [4, 3, 1]]})")}, "t"),
               "t: g: 'w' is [4, 3] at [0, 0], which is not a box of a [4, 3, 1] tensor");
  EXPECT_ERROR(ShardedTensors({with("h", R"({"w": [[0, 0], [9223372036854775807, 9223372036854775807]]})")}, "t"),
               "t: h: 'w' is [9223372036854775807, 9223372036854775807], more elements than 64 bits count");
  EXPECT_ERROR(ShardedTensors({with("i", R"({"w": [[0, 0], [4, 6]]})", R"({"w": [0, [4, 3]]})")}, "t"),
               "t: i: 'w' is in both tandem_rows and tandem_chunks");
  EXPECT_ERROR(ShardedTensors({with("j", R"({"w": [[0, 0], [4, 6]]})")}, "t"),
               "t: 'w' elements [0:4, 3:6] are in no file: a shard is missing");
}

// Files an earlier Tandem wrote (tandem_rows) load as the boxes they are.
TEST_F(ShardedTensorsTest, RowsFilesOfEarlierTandemsStillLoad) {
  const at::Tensor w = at::randn({10, 3}), s = at::randn({});
  auto rows_file = [&](const std::string& name, int64_t first, int64_t count, bool scalar) {
    std::vector<std::pair<std::string, at::Tensor>> tensors{{"w", w.narrow(0, first, count)}};
    std::string rows = R"({"w": [)" + std::to_string(first) + R"(, [10, 3]]})";
    if (scalar) {
      tensors.emplace_back("s", s.reshape({1}));
      rows = R"({"w": [)" + std::to_string(first) + R"(, [10, 3]], "s": [0, []]})";
    }
    return write(name, safetensors_bytes(tensors, {{"format", "pt"}, {kRowsMetadataKey, rows}}));
  };
  const ShardedTensors set({rows_file("r0", 0, 4, true), rows_file("r1", 4, 4, false), rows_file("r2", 8, 2, false)},
                           "test");
  EXPECT_TRUE(at::equal(set.whole("w"), w));
  EXPECT_TRUE(at::equal(set.whole("s"), s));
  EXPECT_TRUE(at::equal(set.chunk("w", {3, 1}, {6, 2}), w.narrow(0, 3, 6).narrow(1, 1, 2)));
  EXPECT_TRUE(at::equal(set.chunk("s", {}, {}), s));
}

}  // namespace
}  // namespace tandem::accelerate
