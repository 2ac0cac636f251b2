// results.md and the comparison of two runs, rendered from the fixture (fixture.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

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

// The fixture plus Tandem's multi-process runs on MPI: ddp 100 ms, no-sync 110 ms, accelerate
// 104 ms, the gradient all-reduce 2 ms (repeat 1: x 1.25, as the fixture), and a sweep of two
// sizes on each backend at 2 ranks.
Results with_mpi() {
  auto results = test::fixture();
  results.config.backends = {"gloo", "mpi"};
  const auto gloo = results.runs;
  for (auto r : gloo) {
    if (r.impl != "tandem" || r.backend != "gloo") continue;
    const double slow = r.repeat == 1 ? 1.25 : 1.0;
    if (r.strategy == "ddp") r.p50_s = 0.100 * slow;
    if (r.strategy == "accelerate") r.p50_s = 0.104 * slow;
    if (r.strategy == "allreduce") r.allreduce_p50_s = 0.002 * slow;
    r.backend = "mpi";
    results.runs.push_back(r);
  }
  for (const char* backend : {"gloo", "mpi"}) {
    Run sweep;
    sweep.impl = "tandem";
    sweep.model = "small";
    sweep.strategy = "sweep";
    sweep.backend = backend;
    sweep.world = 2;
    sweep.repeat = -1;
    const double scale = std::string(backend) == "mpi" ? 0.5 : 1.0;
    sweep.sweep = {{65536, 0.001 * scale}, {int64_t{64} << 20, 0.100 * scale}};
    sweep.p50_s = sweep.p95_s = 0.1;
    results.runs.push_back(sweep);
  }
  return results;
}

TEST(Markdown, GlooAgainstMpiWithPyTorchOnGloo) {
  const auto results = with_mpi();
  const auto md = render_markdown(results, analyze(results));
  // Rows name their backend once a run compares backends; one-process rows have none.
  EXPECT_TRUE(has(md, "| Tandem single | 1 | 90 (80...100) |")) << md;
  EXPECT_TRUE(has(md, "| Tandem ddp (gloo) | 2 | 144 (128...160) |")) << md;
  EXPECT_TRUE(has(md, "| Tandem ddp (mpi) | 2 | 180 (160...200) |")) << md;
  EXPECT_TRUE(has(md, "| Tandem dp-replicate | 2 |")) << md;
  EXPECT_TRUE(has(md, "| PyTorch ddp (gloo) | 2 | 112 (100...125) |")) << md;
  // MPI's row against PyTorch DDP on Gloo: 160 / 100 ms.
  EXPECT_TRUE(has(md, "| 1.60 (1.60...1.60) vs ddp |")) << md;
  // The comparison: step p50s, Gloo / MPI, PyTorch / each, within each repeat.
  EXPECT_TRUE(has(md, "## Gloo vs MPI")) << md;
  EXPECT_TRUE(has(md, "| small | 2 | ddp step | 140.6 (125.0...156.2) | 112.5 (100.0...125.0) | 1.25 (1.25...1.25) | "
                      "180.0 (160.0...200.0) | 1.60 (1.60...1.60) | 1.28 (1.28...1.28) |")) << md;
  EXPECT_TRUE(has(md, "| small | 2 | gradient all-reduce (DDP's buckets) | 4.5 (4.0...5.0) | 2.2 (2.0...2.5) | "
                      "2.00 (2.00...2.00) | – | – | – |")) << md;
  EXPECT_TRUE(has(md, "- **small: ddp (mpi) on 2 devices**: ")) << md;
  // The sweep: a column pair per (world, backend).
  EXPECT_TRUE(has(md, "| size | 2 ranks, gloo ms | GB/s | 2 ranks, mpi ms | GB/s |")) << md;
  EXPECT_TRUE(has(md, "| 64 KiB | 1.000 | 0.07 | 0.500 | 0.13 |")) << md;
  EXPECT_TRUE(has(md, "| 64 MiB | 100.000 | 0.67 | 50.000 | 1.34 |")) << md;

  // Re-rendered from results.json (`tandem report`), the same table.
  const auto back = results_from_json(to_json(results), "memory");
  EXPECT_EQ(render_markdown(back, analyze(back)), md);
}

TEST(Markdown, AGlooOnlyRunHasNoBackendTable) {
  const auto results = test::fixture();
  const auto md = render_markdown(results, analyze(results));
  EXPECT_FALSE(has(md, "Gloo vs MPI")) << md;
  EXPECT_FALSE(has(md, "(gloo)")) << md;
  EXPECT_FALSE(has(md, "## All-reduce sweep")) << md;
}

TEST(Markdown, AFailedMeasurementIsListedWithItsLog) {
  auto results = test::fixture();
  results.failures.push_back({{"tandem", "small", "ddp", 2}, 1, "exit code 1; log: /x/007.log"});
  const auto md = render_markdown(results, analyze(results));
  EXPECT_TRUE(has(md, "- FAILED tandem small ddp (2 devices), repeat 1: exit code 1; log: /x/007.log")) << md;
}

// ZeRO-1 beside DDP: the accounted model state, the busiest rank's, and the optimizer's share.
TEST(Markdown, ModelStatePerRankWhereRecorded) {
  auto results = test::fixture();
  constexpr int64_t kMiB = 1 << 20;
  std::vector<bench::Run> zero;
  for (auto& r : results.runs) {
    if (r.impl != "tandem" || r.strategy != "ddp" || r.world != 2) continue;
    r.model_state = {{4 * kMiB, 4 * kMiB, 4 * kMiB}, {4 * kMiB, 4 * kMiB, 4 * kMiB}};
    bench::Run z = r;
    z.strategy = "zero1";
    z.model_state = {{4 * kMiB, 4 * kMiB, 3 * kMiB}, {4 * kMiB, 4 * kMiB, kMiB}};  // uneven shares: the largest shows
    zero.push_back(z);
  }
  ASSERT_FALSE(zero.empty());
  results.runs.insert(results.runs.end(), zero.begin(), zero.end());
  const auto md = render_markdown(results, analyze(results));
  EXPECT_TRUE(has(md, "## Model state per rank (accounted, MiB, the largest rank)")) << md;
  EXPECT_TRUE(has(md, "| small | Tandem ddp | 2 | 4.00 | 4.00 | 4.00 | 12.00 | 1.00 |")) << md;
  EXPECT_TRUE(has(md, "| small | Tandem zero1 | 2 | 4.00 | 4.00 | 3.00 | 11.00 | 0.75 |")) << md;
  // Kept in results.json, and the same table re-rendered from it.
  const auto back = results_from_json(to_json(results), "memory");
  EXPECT_EQ(render_markdown(back, analyze(back)), md);
  // Results without it have no such section.
  const auto plain = test::fixture();
  EXPECT_FALSE(has(render_markdown(plain, analyze(plain)), "Model state per rank"));
}

TEST(Markdown, FsdpStepByPhaseBesideDdp) {
  auto results = test::fixture();
  std::vector<bench::Run> fsdp;
  for (const auto& r : results.runs) {
    if (r.impl != "tandem" || r.strategy != "ddp" || r.world != 2) continue;
    bench::Run f = r;
    f.strategy = "fsdp";
    f.p50_s = 0.100;
    f.forward_s = 0.040;
    f.backward_s = 0.055;
    f.optimizer_s = 0.005;
    f.exposed_gather_s = 0.012;
    f.exposed_reduce_scatter_s = 0.003;
    fsdp.push_back(f);
  }
  ASSERT_FALSE(fsdp.empty());
  results.runs.insert(results.runs.end(), fsdp.begin(), fsdp.end());
  const auto md = render_markdown(results, analyze(results));
  EXPECT_TRUE(has(md, "### FSDP's step by phase (ms, rank 0, medians)")) << md;
  EXPECT_TRUE(has(md, "| small | Tandem FSDP | 2 | 100.0 | 40.0 | 55.0 | 5.0 | 12.0 | 3.0 |")) << md;
  EXPECT_TRUE(has(md, "| small | Tandem ddp | 2 |")) << md;
  // Its exposed communication in "Where the step goes" is the two waits summed: the row of that
  // table (step, compute, exposed comm, other) has 15.0 in its exposed-comm column.
  const auto table = md.find("## Where the step goes");
  ASSERT_NE(table, std::string::npos) << md;
  const auto row = md.find("| small | Tandem FSDP | 2 | 100.0 | ", table);
  ASSERT_NE(row, std::string::npos) << md;
  std::vector<std::string> cells;
  std::stringstream line(md.substr(row, md.find('\n', row) - row));
  for (std::string cell; std::getline(line, cell, '|');) cells.push_back(cell);
  ASSERT_EQ(cells.size(), 8u) << md.substr(row, 120);  // "" and 7 columns
  EXPECT_EQ(cells[6], " 15.0 ") << md.substr(row, 120);
  const auto back = results_from_json(to_json(results), "fsdp");
  EXPECT_EQ(render_markdown(back, analyze(back)), md);
  const auto plain = test::fixture();
  EXPECT_FALSE(has(render_markdown(plain, analyze(plain)), "FSDP's step by phase"));
}

// Tensor parallelism's own table: its TP group's collectives per step beside DDP's step and model
// state; fsdp+tp also in FSDP's step table, under the one DDP line of its world.
TEST(Markdown, TensorParallelCollectivesBesideDdp) {
  auto results = test::fixture();
  const int64_t MiB = 1024 * 1024;
  std::vector<bench::Run> added;
  for (auto& r : results.runs) {
    if (r.impl != "tandem" || r.strategy != "ddp" || r.world != 2) continue;
    r.model_state = {{4 * MiB, 4 * MiB, 4 * MiB}, {4 * MiB, 4 * MiB, 4 * MiB}};
    bench::Run tp = r;
    tp.strategy = "tp";
    tp.p50_s = 0.200;
    tp.tp_size = 2;
    tp.tp_comm_s = 0.050;
    tp.tp_comm_bytes = 3 * MiB;
    tp.tp_collectives = 28;
    tp.model_state = {{2 * MiB, 2 * MiB, 2 * MiB}, {2 * MiB, 2 * MiB, 2 * MiB}};
    added.push_back(tp);
    bench::Run both = tp;
    both.strategy = "fsdp+tp";
    both.exposed_gather_s = 0.004;
    both.exposed_reduce_scatter_s = 0.006;
    added.push_back(both);
    bench::Run fsdp = both;
    fsdp.strategy = "fsdp";
    fsdp.tp_size = 0;
    fsdp.tp_comm_s = -1;
    added.push_back(fsdp);
  }
  ASSERT_FALSE(added.empty());
  results.runs.insert(results.runs.end(), added.begin(), added.end());
  const auto md = render_markdown(results, analyze(results));
  EXPECT_TRUE(has(md, "### Tensor parallelism: its collectives per step (rank 0, medians)")) << md;
  // ddp: steps 125 and 156.25 ms, exposed 15 and 18.75 ms.
  EXPECT_TRUE(has(md, "| small | Tandem TP | 2 | 2 | 200.0 | 28 | 3.00 | 50.0 | 25 % | 6.00 | 140.6 | 16.9 | 12.00 |")) << md;
  EXPECT_TRUE(has(md, "| small | Tandem FSDP+TP | 2 | 2 | 200.0 | 28 | 3.00 | 50.0 | 25 % |")) << md;
  const auto fsdp_table = md.find("### FSDP's step by phase");
  ASSERT_NE(fsdp_table, std::string::npos) << md;
  const auto ddp_line = md.find("| small | Tandem ddp | 2 |", fsdp_table);
  ASSERT_NE(ddp_line, std::string::npos) << md;
  EXPECT_EQ(md.find("| small | Tandem ddp | 2 |", ddp_line + 1), md.find("| small | Tandem ddp | 2 |", md.find("### Tensor")))
      << "DDP's line appears twice in FSDP's step table: " << md;
  const auto back = results_from_json(to_json(results), "tp");
  EXPECT_EQ(render_markdown(back, analyze(back)), md);
  const auto plain = test::fixture();
  EXPECT_FALSE(has(render_markdown(plain, analyze(plain)), "### Tensor parallelism"));
}

// The pipeline's table: each rank's bubble beside the theory's and its activations; then 1F1B
// against GPipe stage by stage (PyTorch's, without activations measured, has no such line).
TEST(Markdown, PipelineBubbleAndActivationsPerStage) {
  const auto results = test::with_pipeline();
  const auto md = render_markdown(results, analyze(results));
  EXPECT_TRUE(has(md, "### Pipeline: bubble and activation memory per stage (medians)")) << md;
  // Steps 300 and 375 ms (repeat 1 is 25 % slower).
  EXPECT_TRUE(has(md, "| small | Tandem PP GPipe | 2 | 4 | 337.5 | 20 % | 35 % / 25 % | 4.00 / 2.00 |")) << md;
  EXPECT_TRUE(has(md, "| small | Tandem PP 1F1B | 2 | 4 | 360.0 | 20 % | 35 % / 25 % | 2.00 / 0.50 |")) << md;
  EXPECT_TRUE(has(md, "| small | PyTorch PP 1F1B | 2 | 4 | 371.2 | 20 % | 35 % / 25 % | – / – |")) << md;
  EXPECT_TRUE(has(md, "- small, Tandem PP 1F1B at 2 devices, 4 microbatches: activations held on stage 0 2.00 MiB "
                      "against GPipe's 4.00 (50 %), on stage 1 0.50 MiB against 2.00 (25 %).")) << md;
  EXPECT_FALSE(has(md, "- small, PyTorch PP 1F1B")) << md;
  const auto back = results_from_json(to_json(results), "pp");
  EXPECT_EQ(render_markdown(back, analyze(back)), md);
  const auto plain = test::fixture();
  EXPECT_FALSE(has(render_markdown(plain, analyze(plain)), "### Pipeline"));
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
