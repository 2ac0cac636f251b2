// The memory frontier's rules and report that need no cgroup: which strategies a world and a
// family allow, and the report of a real run (tests/bench/data/frontier-tp-cpu.json: `tandem bench
// --memory-budget 1G --nproc 4 --strategies ddp,fsdp,tp,fsdp+tp` on the 2-core machine).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/frontier.h"

namespace tandem::bench {
namespace {

TEST(Frontier, TensorParallelismNeedsItsMeshAndDivisibleHeads) {
  EXPECT_EQ(frontier_refusal("ddp", "cpu", 3), "");
  EXPECT_EQ(frontier_refusal("tp", "cpu", 4), "");      // 4 heads, 2048 classes
  EXPECT_EQ(frontier_refusal("fsdp+tp", "cpu", 4), "");  // 2 x 2
  EXPECT_EQ(frontier_refusal("tp", "cpu", 3),
            "tp cuts the cpu family's 4 heads and 2048 classes over 3 processes: they do not divide");
  EXPECT_EQ(frontier_refusal("tp", "tiny", 4),
            "tp cuts the tiny family's 2 heads and 64 classes over 4 processes: they do not divide");
  EXPECT_EQ(frontier_refusal("fsdp+tp", "cpu", 2),
            "fsdp+tp needs a 2-D mesh of at least two tensor-parallel pairs: an even --nproc of at least 4 (got 2)");
  EXPECT_EQ(frontier_refusal("fsdp+tp", "cpu", 6), "");
  // By name only: the default search stays the batch-parallel one.
  for (const auto& s : frontier_default_strategies()) EXPECT_EQ(s.find("tp"), std::string::npos) << s;
}

TEST(Frontier, TheReportComparesTensorParallelismWithWhatItExtends) {
  std::ifstream in(std::string(BENCH_TEST_DATA) + "/frontier-tp-cpu.json");
  ASSERT_TRUE(in) << "the fixture is missing";
  const auto results = nlohmann::json::parse(in);
  const std::string md = render_frontier_markdown(results);
  // From the file's own rows: tp and ddp both stop at member 10, fsdp+tp and fsdp at 11.
  EXPECT_NE(md.find("| Tandem tp | 10: L12 d448 | 30.87 M |"), std::string::npos) << md;
  EXPECT_NE(md.find("- Tandem tp against Tandem ddp: largest member 10 against 10: the same model, at 608 against "
                    "529 tokens/s (1.15x)."),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("- Tandem fsdp+tp against Tandem fsdp: largest member 11 against 11: the same model, at 579 "
                    "against 483 tokens/s (1.20x)."),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("Not measured here: pipeline parallelism"), std::string::npos) << md;
  EXPECT_EQ(md.find("tensor and pipeline parallelism"), std::string::npos) << md;
}

}  // namespace
}  // namespace tandem::bench
