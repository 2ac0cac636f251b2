// results.md and the comparison of two runs, rendered from the fixture (fixture.h).
#include <gtest/gtest.h>

#include <algorithm>

#include "bench/markdown.h"
#include "fixture.h"

namespace tandem::bench {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Markdown, EveryRowWithItsFigures) {
  const auto results = test::fixture();
  const auto md = render_markdown(results, analyze(results));
  // model | strategy | devices | samples/s | per device | p50 | p95 | eff | mem0 | mem others | exposed | busbw | peer
  EXPECT_TRUE(has(md, "| small (536 k params, batch 10/device) | Tandem single | 1 | 90 (80...100) | 90 |")) << md;
  EXPECT_TRUE(has(md, "| Tandem ddp | 2 | 144 (128...160) | 72 | 140.6 (125.0...156.2) |")) << md;
  EXPECT_TRUE(has(md, "| 0.80 | 100 | 100 | 16.9 | 0.90 | 1.28 (1.28...1.28) vs ddp |")) << md;
  EXPECT_TRUE(has(md, "| Tandem dp-replicate | 2 | 72 (64...80) |")) << md;
  EXPECT_TRUE(has(md, "| 0.40 | 300 | 150 | – | – | – |")) << md;
  EXPECT_TRUE(has(md, "| Tandem Accelerator | 2 |")) << md;
  EXPECT_TRUE(has(md, "| PyTorch ddp | 2 | 112 (100...125) |")) << md;
  // Breakdown: step, compute, exposed, other (medians, ms).
  EXPECT_TRUE(has(md, "| small | Tandem ddp | 2 | 140.6 | 112.5 | 16.9 | 11.3 |")) << md;
  EXPECT_TRUE(has(md, "- **small: ddp on 2 devices**: ")) << md;
  EXPECT_TRUE(has(md, "small 4.00 MB in 2 bucket(s)")) << md;
  // What did not run says why.
  EXPECT_TRUE(has(md, "- pytorch dp (2 devices): torch.nn.DataParallel replicates only across CUDA devices")) << md;
  EXPECT_TRUE(has(md, "Machine: Test CPU, 2 cores, 24 GiB, 0 GPU(s)")) << md;
  EXPECT_FALSE(has(md, "## Projection")) << "no sweep and no --project: no projection section";
}

TEST(Markdown, AFailedMeasurementIsListedWithItsLog) {
  auto results = test::fixture();
  results.failures.push_back({{"tandem", "small", "ddp", 2}, 1, "exit code 1; log: /x/007.log"});
  const auto md = render_markdown(results, analyze(results));
  EXPECT_TRUE(has(md, "- FAILED tandem small ddp (2 devices), repeat 1: exit code 1; log: /x/007.log")) << md;
}

TEST(Markdown, ComparisonOfTwoRuns) {
  const auto a = test::fixture();
  auto b = a;
  for (auto& r : b.runs) {
    if (r.impl == "tandem" && r.strategy == "ddp") r.p50_s /= 2;  // twice as fast
  }
  b.runs.erase(std::remove_if(b.runs.begin(), b.runs.end(), [](const bench::Run& r) { return r.strategy == "dp-replicate"; }),
               b.runs.end());
  const auto md = render_comparison("A", a, analyze(a), "B", b, analyze(b));
  EXPECT_TRUE(has(md, "| small | Tandem ddp | 2 | 144 (128...160) | 288 (256...320) | 2.00 |")) << md;
  EXPECT_TRUE(has(md, "| small | Tandem single | 1 | 90 (80...100) | 90 (80...100) | 1.00 |")) << md;
  EXPECT_TRUE(has(md, "only in A: small Tandem dp-replicate (2 devices)")) << md;
}

}  // namespace
}  // namespace tandem::bench
