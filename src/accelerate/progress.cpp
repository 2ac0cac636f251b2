#include "tandem/accelerate/progress.h"

#include <unistd.h>

#include <cmath>

namespace tandem::accelerate {
namespace {

std::string duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(text, sizeof(text), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof(text), "%lds", s);
  }
  return text;
}

}  // namespace

ProgressBar::ProgressBar(int64_t total_steps, std::string label, bool enabled, std::FILE* out)
    : total_(total_steps), label_(std::move(label)), enabled_(enabled), out_(out ? out : stdout),
      terminal_(::isatty(::fileno(out_)) == 1) {}

std::string ProgressBar::line() const {
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const double rate = elapsed > 0 ? samples_ / elapsed : 0;
  const double eta = step_ > 0 ? elapsed / step_ * static_cast<double>(total_ - step_) : NAN;
  char text[256];
  std::snprintf(text, sizeof(text), "%s step %lld/%lld (%3.0f%%) | %.1f samples/s | loss %.4f | elapsed %s | ETA %s",
                label_.c_str(), static_cast<long long>(step_), static_cast<long long>(total_),
                total_ > 0 ? 100.0 * static_cast<double>(step_) / static_cast<double>(total_) : 0.0, rate, loss_,
                duration(elapsed).c_str(), duration(eta).c_str());
  return text;
}

void ProgressBar::update(int64_t step, int64_t samples, double loss) {
  if (!enabled_) return;
  step_ = step;
  samples_ += samples;
  loss_ = loss;
  const auto now = Clock::now();
  // A terminal redraws at most 10 times a second; a log gets a line every 10 seconds.
  const auto every = terminal_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(10000);
  if (printed_ && now - last_print_ < every && step_ != total_) return;
  last_print_ = now;
  printed_ = true;
  printed_step_ = step_;
  std::fprintf(out_, terminal_ ? "\r%s\033[K" : "%s\n", line().c_str());
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (!enabled_) return;
  if (!terminal_ && printed_ && printed_step_ == step_) return;  // the last line is already there
  std::fprintf(out_, terminal_ ? "\r%s\033[K\n" : "%s\n", line().c_str());
  std::fflush(out_);
}

}  // namespace tandem::accelerate
