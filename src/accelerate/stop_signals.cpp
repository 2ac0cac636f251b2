// Note [Stopping on a signal]
// A scheduler stops a job with SIGTERM and a grace period (Slurm's preemption and time limit,
// `tandem run` forwarding its own signal, an elastic job starting its next round), and a program
// that saves then loses nothing. The handler only records the signal; the loop asks
// stop_requested() after its step, and the processes agree (a max all-reduce of the signal
// number) so that every one saves the same step, whichever received the signal first. A second
// signal of the same kind restores the default action and raises it again: a process stuck
// outside its loop still stops.
#include <csignal>

#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int sig) {
  if (g_stop_signal == sig) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

}  // namespace

void Accelerator::handle_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT}) ::sigaction(sig, &sa, nullptr);
  handling_stop_signals_ = true;
}

bool Accelerator::stop_requested() {
  if (!handling_stop_signals_) return false;
  int sig = g_stop_signal;
  if (pg_ && pg_->size() > 1) {
    at::Tensor flag = at::full({1}, sig, at::kInt);
    pg_->all_reduce(flag, comm::ReduceOp::Max);
    sig = flag.item<int>();
  }
  if (sig != 0) stop_signal_ = sig;
  return sig != 0;
}

}  // namespace tandem
