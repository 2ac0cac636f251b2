#pragma once
// What one configuration costs a rank: its peak memory by kind (memory.cpp, Note [Peak memory])
// and its step time by cause (step_time.cpp, Note [Step time]).
#include <string>

#include "plan/configuration.h"

namespace tandem::plan {

/// Bytes one rank holds at its step's peak, on its busiest pipeline stage.
struct Memory {
  double weights = 0, gradients = 0, optimizer = 0;  // the model state (the ZeRO paper's "model states")
  double activations = 0;   // what autograd keeps for backward, and the loss's rows
  double buffers = 0;       // communication buffers and gathered whole parameters
  double runtime = 0;       // the runtime's own (the profile's)
  double model_states() const { return weights + gradients + optimizer; }
  double total() const { return model_states() + activations + buffers + runtime; }
};
Memory peak_memory(const Job& job, const Configuration& config);

/// Seconds of one optimizer step, on the slowest stage.
struct StepTime {
  double compute = 0;        // matmuls at the profile's rate, the rest at its memory bandwidth
  double exposed_comm = 0;   // communication compute does not hide (data parallel, tensor parallel, p2p)
  double bubble = 0;         // a pipeline's idle time: (pp - 1) microbatches' work
  double comm = 0;           // all communication, hidden or not
  double step() const { return compute + exposed_comm + bubble; }
};
StepTime step_time(const Job& job, const Configuration& config);

}  // namespace tandem::plan
