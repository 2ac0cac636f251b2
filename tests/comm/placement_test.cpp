// Placements (comm/placement.h): every coordinate's box equals what torch.chunk, applied mesh
// dimension by mesh dimension to a tensor of element indices, leaves there (an independent
// computation of DTensor's rule); DTensor's own table; who writes a piece; one-line errors.
// PyTorch's compute_local_shape_and_global_offset itself is the oracle of accelerate.chunks.interop.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include <ATen/ATen.h>

#include "support/errors.h"
#include "tandem/comm/placement.h"

namespace tandem::comm {
namespace {

using P = Placement;

// Every coordinate of a mesh of `mesh_shape`, row-major.
std::vector<std::vector<int64_t>> coordinates(const std::vector<int64_t>& mesh_shape) {
  std::vector<std::vector<int64_t>> out{{}};
  for (int64_t size : mesh_shape) {
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

// What the process at `coordinate` holds, by torch.chunk: each Shard(d) chunks what is left along
// d into mesh_shape[m] pieces and keeps the coordinate's one (none when chunk gives fewer); the
// mesh dimensions left to right, a _StridedShard once the plain ones have cut (FSDP's rows of a
// tensor-parallel piece).
at::Tensor chunked(at::Tensor t, const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& coordinate,
                   const std::vector<Placement>& placements) {
  std::vector<size_t> order;
  for (bool strided : {false, true}) {
    for (size_t m = 0; m < placements.size(); ++m) {
      if (placements[m].is_strided() == strided) order.push_back(m);
    }
  }
  for (size_t m : order) {
    if (!placements[m].is_shard()) continue;
    const int64_t d = placements[m].dim < 0 ? placements[m].dim + t.dim() : placements[m].dim;
    const auto pieces = t.size(d) == 0 ? std::vector<at::Tensor>{} : at::chunk(t, mesh_shape[m], d);
    t = coordinate[m] < static_cast<int64_t>(pieces.size()) ? pieces[coordinate[m]] : t.narrow(d, 0, 0);
  }
  return t;
}

TEST(Placement, EveryBoxIsWhatTorchChunkLeavesThere) {
  const std::vector<std::vector<int64_t>> shapes{{7, 5}, {8, 6}, {3, 4}, {1, 9}, {0, 4}, {10}, {5, 2, 3}};
  const std::vector<std::pair<std::vector<int64_t>, std::vector<std::vector<Placement>>>> meshes{
      {{4}, {{P::shard(0)}, {P::shard(1)}, {P::replicate()}, {P::shard(-1)}}},
      {{2, 2},
       {{P::shard(0), P::shard(1)},
        {P::shard(1), P::shard(0)},
        {P::shard(0), P::shard(0)},
        {P::shard(1), P::shard(1)},
        {P::replicate(), P::shard(0)},
        {P::shard(1), P::replicate()},
        {P::partial(), P::shard(0)}}},
      {{1, 4}, {{P::shard(0), P::shard(1)}, {P::replicate(), P::shard(0)}}},
      {{4, 1}, {{P::shard(0), P::shard(1)}, {P::shard(1), P::shard(0)}}},
      {{2, 3, 2}, {{P::shard(0), P::shard(1), P::shard(0)}, {P::replicate(), P::shard(0), P::shard(-1)}}},
      // FSDP over tensor parallelism: ("replicate", "shard", "tp").
      {{2, 2, 2},
       {{P::replicate(), P::strided_shard(0, 2), P::shard(0)},
        {P::replicate(), P::strided_shard(0, 2), P::shard(1)},
        {P::replicate(), P::strided_shard(0, 2), P::replicate()}}},
      {{3, 2}, {{P::strided_shard(0, 2), P::shard(0)}}},
  };
  int checked = 0;
  for (const auto& shape : shapes) {
    int64_t numel = 1;
    for (auto s : shape) numel *= s;
    const at::Tensor index = at::arange(numel, at::kLong).reshape(shape);
    for (const auto& [mesh, all] : meshes) {
      for (const auto& placements : all) {
        bool fits = true;  // 1-D shapes take only placements of dims 0 and -1
        const auto ndim = static_cast<int64_t>(shape.size());
        for (const auto& p : placements) fits = fits && (!p.is_shard() || (p.dim < ndim && p.dim >= -ndim));
        if (!fits) continue;
        for (const auto& c : coordinates(mesh)) {
          const Chunk chunk = local_chunk(shape, mesh, c, placements);
          const at::Tensor expected = chunked(index, mesh, c, placements);
          ASSERT_EQ(chunk.sizes, expected.sizes().vec()) << to_string(placements) << " of " << index.sizes();
          EXPECT_TRUE(at::equal(narrow_to(index, chunk), expected))
              << to_string(placements) << " at " << c10::IntArrayRef(c) << " of " << index.sizes();
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 300);
}

// DTensor's docstring table: [2, 5] on a 2 x 2 mesh as (Shard(1), Shard(1)).
TEST(Placement, DTensorsExampleTable) {
  const std::vector<P> placements{P::shard(1), P::shard(1)};
  EXPECT_EQ(local_chunk({2, 5}, {2, 2}, {0, 0}, placements), (Chunk{{0, 0}, {2, 2}}));
  EXPECT_EQ(local_chunk({2, 5}, {2, 2}, {0, 1}, placements), (Chunk{{0, 2}, {2, 1}}));
  EXPECT_EQ(local_chunk({2, 5}, {2, 2}, {1, 0}, placements), (Chunk{{0, 3}, {2, 1}}));
  EXPECT_EQ(local_chunk({2, 5}, {2, 2}, {1, 1}, placements), (Chunk{{0, 4}, {2, 1}}));
  // An empty piece starts at the dimension's size, as DTensor says.
  EXPECT_EQ(local_chunk({5}, {4}, {3}, {P::shard(0)}), (Chunk{{5}, {0}}));
  EXPECT_EQ(local_chunk({}, {2}, {1}, {P::replicate()}), (Chunk{{}, {}}));
}

// FSDP2 over tensor parallelism (a colwise weight [7, 5] on a ("shard", "tp") mesh of 2 x 2): the
// tensor-parallel rank's rows first ([0, 4) and [4, 7)), then FSDP's rows of those.
TEST(Placement, AStridedShardCutsWhatTheLaterShardLeft) {
  const std::vector<P> placements{P::strided_shard(0, 2), P::shard(0)};
  EXPECT_EQ(local_chunk({7, 5}, {2, 2}, {0, 0}, placements), (Chunk{{0, 0}, {2, 5}}));
  EXPECT_EQ(local_chunk({7, 5}, {2, 2}, {1, 0}, placements), (Chunk{{2, 0}, {2, 5}}));
  EXPECT_EQ(local_chunk({7, 5}, {2, 2}, {0, 1}, placements), (Chunk{{4, 0}, {2, 5}}));
  EXPECT_EQ(local_chunk({7, 5}, {2, 2}, {1, 1}, placements), (Chunk{{6, 0}, {1, 5}}));
  EXPECT_EQ(to_string(placements), "(_StridedShard(dim=0, sf=2), Shard(0))");
}

TEST(Placement, OnlyTheFirstReplicaWritesAndPartialIsRefused) {
  EXPECT_TRUE(writes_chunk({1, 1}, {P::shard(0), P::shard(1)}, "w"));
  EXPECT_TRUE(writes_chunk({0, 1}, {P::replicate(), P::shard(0)}, "w"));
  EXPECT_FALSE(writes_chunk({1, 0}, {P::replicate(), P::shard(0)}, "w"));
  EXPECT_FALSE(writes_chunk({0, 2}, {P::shard(0), P::replicate()}, "w"));
  EXPECT_ERROR(writes_chunk({0, 0}, {P::shard(0), P::partial()}, "save: 'fc.weight'"),
               "save: 'fc.weight' is (Shard(0), Partial(sum)): a Partial() tensor holds partial sums, not a piece of "
               "the tensor; reduce it to Replicate() before saving");
  EXPECT_ERROR(writes_chunk({0}, {P::shard(0), P::shard(1)}, "save: 'w'"),
               "save: 'w': 2 placement(s) for a coordinate of 1 dimension(s)");
}

TEST(Placement, BadPlacementsAreOneLine) {
  EXPECT_ERROR(local_chunk({4, 3}, {2, 2}, {0, 0}, {P::shard(0)}),
               "placements (Shard(0)): 1 placement(s) for a mesh of 2 dimension(s); give one per mesh dimension");
  EXPECT_ERROR(local_chunk({4, 3}, {2}, {0}, {P::shard(2)}),
               "placements (Shard(2)): Shard(2) of a 2-dimensional tensor [4, 3] (it has no dimension 2)");
  EXPECT_ERROR(local_chunk({4, 3}, {2}, {0}, {P::shard(-3)}),
               "placements (Shard(-3)): Shard(-3) of a 2-dimensional tensor [4, 3] (it has no dimension -3)");
  EXPECT_ERROR(local_chunk({}, {2}, {0}, {P::shard(0)}),
               "placements (Shard(0)): Shard(0) of a 0-dimensional tensor [] (it has no dimension 0)");
  EXPECT_ERROR(local_chunk({4}, {2}, {2}, {P::shard(0)}), "placements: coordinate 2 along mesh dimension 0 of size 2");
  EXPECT_ERROR(local_chunk({4}, {2}, {0, 0}, {P::shard(0)}), "placements: coordinate of 2 dimension(s) on a mesh of 1");
  EXPECT_ERROR(narrow_to(at::zeros({4}), Chunk{{0, 0}, {2, 2}}),
               "narrow_to: a chunk of 2 dimension(s) of a 1-dimensional tensor");
  EXPECT_EQ(to_string({P::shard(0), P::replicate(), P::partial()}), "(Shard(0), Replicate(), Partial(sum))");
}

}  // namespace
}  // namespace tandem::comm
