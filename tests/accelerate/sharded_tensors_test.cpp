// Row-sharded safetensors files (Note [Row-sharded files]): any rows of any tensor read from the
// pieces of any cut equal the same rows of the whole tensor, and a set whose pieces do not tile
// every tensor exactly is refused with one line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "accelerate/sharded_tensors.h"
#include "support/errors.h"
#include "tandem/accelerate/safetensors.h"

namespace tandem::accelerate {
namespace {

namespace fs = std::filesystem;

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
      std::vector<RowPiece> pieces;
      for (const auto& [name, t] : whole) {
        const int64_t rows = t.dim() == 0 ? 1 : t.size(0), chunk = (rows + world - 1) / world;
        const int64_t first = std::min(rows, r * chunk), count = std::min(rows, first + chunk) - first;
        if (count == 0) continue;
        at::Tensor piece = t.dim() == 0 ? t.reshape({1}) : t.narrow(0, first, count);
        pieces.push_back({name, piece, first, t.sizes().vec()});
      }
      if (r == 0) {
        for (const auto& [name, t] : extra) pieces.push_back({name, t, 0, t.sizes().vec()});
      }
      paths.push_back(write(prefix + ".rank" + std::to_string(r) + ".safetensors", row_pieces_bytes(pieces)));
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

}  // namespace
}  // namespace tandem::accelerate
