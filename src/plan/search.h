#pragma once
// Every configuration of a job, estimated and checked (Note [Search] in search.cpp).
#include <string>
#include <vector>

#include "plan/estimate.h"

namespace tandem::plan {

struct Estimate {
  Configuration config;
  Memory memory;
  StepTime time;
  std::string refusal;  // why it cannot be built or does not fit; "" when it fits
  bool fits() const { return refusal.empty(); }
  bool buildable = true;  // false: refused before estimating (memory and time are zero)
  double tokens_per_s_per_device = 0;
};

/// Why `config` cannot be built for `job` (Tandem's Accelerator refuses it, or the sizes do not
/// divide), or "".
std::string refusal_of(const Job& job, const Configuration& config);
/// `config` estimated, with its refusal: one that cannot be built, or one that needs more memory
/// than a device has.
Estimate estimate(const Job& job, const Configuration& config);

/// Every configuration of DDP, ZeRO-1/2, FSDP and HSDP over the data-parallel ranks, tensor- and
/// pipeline-parallel sizes, checkpointing off and on, and microbatches (powers of two), over the
/// profile's devices: those that fit first, fastest first, then the rest by how much they miss.
/// What the search tries. Sizes given (non-zero) restrict it to them: a product that is not the
/// devices, or sizes every configuration of which cannot be built, is a tandem::Error naming why.
/// Checkpointing: none and full (what Tandem builds) unless told otherwise.
struct SearchSpace {
  int dp = 0, tp = 0, pp = 0;
  std::vector<Checkpointing> checkpointing{Checkpointing::None, Checkpointing::Full};
  bool sequence_parallel = true;  // TP with tp::SequenceParallel on the norms (torchtitan's plan)
};
std::vector<Estimate> plan_all(const Job& job, const SearchSpace& space = {});

/// Checks a job before planning: one line naming what is wrong (a batch that does not divide
/// over any layout, a precision the profile has no rate for).
void check_job(const Job& job);

}  // namespace tandem::plan
