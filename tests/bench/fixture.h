#pragma once
// The hand-made bench folder in tests/bench/data/results.json: one model ("small"), batch 10 per
// device, two repeats, the second uniformly 25 % slower than the first. Per repeat (p50 step):
//   tandem  single 100 ms | ddp x2 125 ms | ddp-no-sync x2 110 ms | accelerate x2 128 ms
//           dp-replicate x2 250 ms (replica peaks 300 and 150 MiB) | allreduce x2 of 4 MB: 4 ms
//   pytorch single 100 ms | ddp x2 160 ms | ddp-no-sync x2 120 ms | dp x2 unsupported
// (repeat 1: every time x 1.25). The tests derive each figure from these by hand.
#include <string>
#include <vector>

#include "bench/results.h"

namespace tandem::bench::test {

inline std::string fixture_dir() { return BENCH_TEST_DATA; }
inline Results fixture() { return load_results(fixture_dir()); }

/// The fixture with pipeline runs beside Tandem's ddp at world 2, in both repeats (m 4, P 2:
/// theory 1/5): Tandem's pp-gpipe (step 300 ms, activations 4 and 2 MiB), pp-1f1b (step 320 ms,
/// 2 and 0.5 MiB), and PyTorch's pp-1f1b (step 330 ms, activations not measured), each step 25 %
/// longer in repeat 1 as the fixture's. Each rank's
/// bubble is 0.30 / 0.20 in repeat 0 and 0.40 / 0.30 in repeat 1 (medians 0.35 / 0.25).
inline Results with_pipeline() {
  auto results = fixture();
  const double MiB = 1024.0 * 1024.0;
  std::vector<Run> added;
  for (const auto& r : results.runs) {
    if (r.impl != "tandem" || r.strategy != "ddp" || r.world != 2) continue;
    Run pp = r;
    pp.bucket_bytes.clear();
    pp.buckets = 0;
    pp.pp_microbatches = 4;
    pp.pp_stages_per_rank = 1;
    pp.pp_bubble_theory = 0.2;
    pp.pp_bubble = r.repeat == 0 ? std::vector<double>{0.30, 0.20} : std::vector<double>{0.40, 0.30};
    for (const char* schedule : {"gpipe", "1f1b"}) {
      pp.strategy = std::string("pp-") + schedule;
      pp.pp_schedule = schedule;
      const bool gpipe = pp.pp_schedule == "gpipe";
      pp.p50_s = (gpipe ? 0.300 : 0.320) * (r.repeat == 1 ? 1.25 : 1.0);
      pp.pp_activation_bytes = gpipe ? std::vector<double>{4 * MiB, 2 * MiB} : std::vector<double>{2 * MiB, 0.5 * MiB};
      added.push_back(pp);
    }
    pp.impl = "pytorch";
    pp.backend = "gloo";
    pp.p50_s = 0.330 * (r.repeat == 1 ? 1.25 : 1.0);
    pp.pp_activation_bytes = {-1, -1};
    added.push_back(pp);
  }
  results.runs.insert(results.runs.end(), added.begin(), added.end());
  return results;
}

}  // namespace tandem::bench::test
