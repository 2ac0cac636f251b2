#pragma once
// ProgressBar: step, samples/s, loss and ETA of a long loop, on one line that redraws itself on a
// terminal, and as plain periodic lines when the output is a file or a pipe (logs stay readable).
//
// Example:
//   auto bar = acc.progress_bar(total_steps, "train");   // shown on the main process only
//   for (...) { ...; bar.update(step, batch_samples, loss.item<double>()); }
//   bar.finish();
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tandem::accelerate {

class ProgressBar {
 public:
  /// `enabled` false: every call does nothing (the other processes). `out` defaults to stdout.
  ProgressBar(int64_t total_steps, std::string label, bool enabled, std::FILE* out = nullptr);
  /// After step `step` (1-based) of `total_steps`, which processed `samples` samples (all
  /// processes together) with this loss.
  void update(int64_t step, int64_t samples, double loss);
  /// The final line (and a newline on a terminal).
  void finish();

  /// The line update() would print now, for tests.
  std::string line() const;

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_;
  std::string label_;
  bool enabled_;
  std::FILE* out_;
  bool terminal_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_print_{};
  int64_t step_ = 0;
  int64_t samples_ = 0;
  double loss_ = 0;
  bool printed_ = false;
  int64_t printed_step_ = -1;
};

}  // namespace tandem::accelerate
