#include "plan/estimate.h"

#include <algorithm>

namespace tandem::plan {

// Note [Peak memory]
// A rank's peak is counted as the sum of what can be alive together in a step, not as a
// timeline: the model state, everything backward keeps, the communication buffers and the
// runtime's own. In a step the gradients grow while the activations are freed, so the sum is an
// upper bound the measured peaks come within a few percent of (docs/benchmarks.md, "Planning").
// - Model state: the ZeRO paper's accounting, exactly (state_bytes): 16 bytes per parameter under
//   bf16 with Adam, 2 + 2 + 12 of them (SGD with momentum: 2 + 2 + 8); ZeRO-1 cuts the 12 over the data-parallel group, ZeRO-2 the
//   gradients too, FSDP everything; under tensor parallelism a rank holds 1/tp of the layers, under
//   a pipeline one stage's.
// - Activations (Note [Planned models]): per microbatch, every block of the stage; a 1F1B
//   pipeline's first stage holds pp microbatches in flight. Checkpointing keeps each block's input
//   and one block's whole activations while it is recomputed; torchtitan's selective policy keeps
//   what Note [Planned models] says (four of its d values whole under TP, the rest cut). The last stage adds the loss's rows.
// - Buffers, as Tandem's strategies hold them: DDP and ZeRO-1 copy the gradients into flat
//   buckets (gradient_as_bucket_view is off by default, as in PyTorch); ZeRO-2 holds autograd's
//   whole gradients and the flat buckets they are reduce-scattered from (measured: its peak is not
//   below ZeRO-1's, docs/benchmarks.md); FSDP and HSDP hold the two largest units gathered
//   (prefetching) and one unit's whole gradients before their reduce-scatter, and on a CPU the
//   host buffer pool's free buffers for the next step (eight of the largest units and the
//   gradient rows); a pipeline stage receives one microbatch's activation.
// - Not counted: the allocator's own keep. Tandem's `return-large` host policy never trims the
//   heap, and under FSDP its free space grew from 121 to 484 MiB over four steps of the frontier's
//   member 15 (docs/benchmarks.md, "Planning"): FSDP's measured CPU peaks exceed the plan.

namespace {

Memory stage_memory(const Job& job, const Configuration& c, int stage) {
  const Model& m = job.model;
  const StateBytes bytes = state_bytes(job.precision, job.optimizer);
  const StageShare share = stage_share(m, c, stage);
  Memory mem;
  mem.weights = bytes.weight * share.params / c.weight_shards();
  mem.gradients = bytes.gradient * share.params / c.gradient_shards();
  mem.optimizer = bytes.optimizer * share.params / c.optimizer_shards();

  const double tokens = static_cast<double>(c.local_batch) / c.microbatches * static_cast<double>(m.seq);
  const double whole = whole_values_per_token(m, c);
  const double block_values = whole + (m.block_saved_values_per_token() - whole) / c.tp;
  const double block = tokens * block_values * bytes.activation;
  const double in_flight = c.pp > 1 ? static_cast<double>(c.pp - stage) : 1.0;
  const double blocks = static_cast<double>(share.blocks);
  if (c.checkpointing != Checkpointing::None) {
    const double input = static_cast<double>(m.dim) / (c.sequence_parallel ? c.tp : 1);
    const double selective_whole = c.sequence_parallel ? 0.0 : m.selective_whole_values_per_token();
    const double kept = c.checkpointing == Checkpointing::Full
                            ? input
                            : selective_whole + (m.selective_saved_values_per_token() - selective_whole) / c.tp;
    mem.activations = in_flight * blocks * tokens * kept * bytes.activation + (share.blocks > 0 ? block : 0.0);
  } else {
    mem.activations = in_flight * blocks * block;
  }
  if (share.head) mem.activations += tokens * 3.0 * static_cast<double>(m.vocab) / c.tp * 4.0;

  if (c.dp * c.tp * c.pp == 1) {
    mem.buffers = 0;  // one process trains without DDP: no buckets (under TP or PP the Accelerator
                      // still wraps DDP over a data-parallel group of one: measured, tp at 2 processes)
  } else if (c.sharding == "ddp" || c.sharding == "zero1") {
    mem.buffers = bytes.gradient * share.params;
  } else if (c.sharding == "zero2") {
    mem.buffers = 2.0 * bytes.gradient * share.params;
  } else if (job.profile.device == "cpu") {
    // Tandem's host buffer pool keeps freed units for the next step, up to eight of the largest
    // and the gradient rows (Note [Host buffer pool] in src/fsdp/engine.cpp), beside those in use.
    mem.buffers = (2.0 * bytes.weight + bytes.gradient) * share.largest_unit_params +
                  8.0 * bytes.weight * share.largest_unit_params + mem.gradients;
  } else {
    mem.buffers = (2.0 * bytes.weight + bytes.gradient) * share.largest_unit_params;
  }
  if (c.pp > 1) mem.buffers += tokens * static_cast<double>(m.dim) * bytes.activation;
  mem.runtime = static_cast<double>(job.profile.runtime_bytes);
  return mem;
}

}  // namespace

Memory peak_memory(const Job& job, const Configuration& config) {
  Memory peak;
  for (int stage = 0; stage < config.pp; ++stage) {
    const Memory m = stage_memory(job, config, stage);
    if (stage == 0 || m.total() > peak.total()) peak = m;
  }
  return peak;
}

}  // namespace tandem::plan
