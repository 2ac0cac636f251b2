#pragma once
// The hand-made bench folder in tests/bench/data/results.json: one model ("small"), batch 10 per
// device, two repeats, the second uniformly 25 % slower than the first. Per repeat (p50 step):
//   tandem  single 100 ms | ddp x2 125 ms | ddp-no-sync x2 110 ms | accelerate x2 128 ms
//           dp-replicate x2 250 ms (replica peaks 300 and 150 MiB) | allreduce x2 of 4 MB: 4 ms
//   pytorch single 100 ms | ddp x2 160 ms | ddp-no-sync x2 120 ms | dp x2 unsupported
// (repeat 1: every time x 1.25). The tests derive each figure from these by hand.
#include <string>

#include "bench/results.h"

namespace tandem::bench::test {

inline std::string fixture_dir() { return BENCH_TEST_DATA; }
inline Results fixture() { return load_results(fixture_dir()); }

}  // namespace tandem::bench::test
