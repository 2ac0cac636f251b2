#include "plan/estimate.h"

#include <algorithm>

#include "bench/projection.h"

namespace tandem::plan {

// Note [Step time]
// - Compute: the matmuls' FLOPs (6 per multiplied weight and token, 2 more for what backward
//   recomputes: every block's under full checkpointing, Note [Planned models]'s share under the
//   selective policy; causal attention's 6 x seq x dim per token and block) at the profile's achieved
//   rate, plus what streams through memory at its bandwidth: each saved activation written in
//   forward and read twice in backward (once more when recomputed), and the optimizer's pass
//   (Adam: 28 bytes per parameter it updates, SGD with momentum 20); and each
//   operator's host overhead where the device does not hide it (the profile's op_overhead_us).
// - Data-parallel communication (the alpha-beta ring of bench/projection.h, hierarchical across
//   nodes): DDP all-reduces the gradients, ZeRO-1 too and then all-gathers the updated weights,
//   ZeRO-2 reduce-scatters and all-gathers, FSDP all-gathers each unit in forward and again in
//   backward and reduce-scatters its gradients, per microbatch; HSDP adds the all-reduce of its
//   shards across replicas. What overlaps (the profile's `overlap` of backward for DDP's
//   gradients, of the whole step for FSDP's prefetched gathers) is hidden; ZeRO's all-gather after
//   the step never is.
// - Tensor parallelism all-reduces a [tokens, dim] activation twice per block in forward and twice
//   in backward (twice more when recomputed), all exposed. A pipeline sends each microbatch's
//   activation forward and its gradient back, and idles (pp - 1) microbatches of its slowest
//   stage's work (1F1B's bubble).

namespace {

// Ring all-reduce (or half of it: a reduce-scatter or an all-gather) over `ranks` devices spaced
// `stride` apart in the row-major layout: within a node while they fit in one.
double allreduce(const Profile& p, double bytes, int ranks, int stride) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const int per_node = std::max(1, std::min(ranks, p.devices_per_node / std::max(1, stride)));
  const int nodes = (ranks + per_node - 1) / per_node;
  return bench::allreduce_seconds(bench::Algorithm::Ring, static_cast<int64_t>(bytes), per_node, nodes, p.intra,
                                  p.inter);
}
double half(const Profile& p, double bytes, int ranks, int stride) { return allreduce(p, bytes, ranks, stride) / 2; }

struct StageTime {
  double compute = 0, backward = 0, tp_comm = 0;
};

StageTime stage_time(const Job& job, const Configuration& c, int stage) {
  const Model& m = job.model;
  const Profile& p = job.profile;
  const StateBytes bytes = state_bytes(job.precision, job.optimizer);
  const StageShare share = stage_share(m, c, stage);
  const double tokens = static_cast<double>(c.local_batch) * static_cast<double>(m.seq);
  // FLOPs per weight and token: forward 2, backward 4, and what backward recomputes.
  const double recomputed = c.checkpointing == Checkpointing::Full        ? 1.0
                            : c.checkpointing == Checkpointing::Selective ? m.selective_recomputed_share()
                                                                          : 0.0;
  const double blocks = static_cast<double>(share.blocks);
  const double block_matmuls = share.matmul_params - (share.head ? static_cast<double>(m.dim * m.vocab) / c.tp : 0.0);
  const double attention = blocks * static_cast<double>(m.seq) * static_cast<double>(m.dim) / c.tp;
  const double flops = tokens * (6.0 * share.matmul_params + 2.0 * recomputed * block_matmuls +
                                 (c.checkpointing == Checkpointing::Full ? 8.0 : 6.0) * attention);
  const double whole = whole_values_per_token(m, c);
  const double values = whole + (m.block_saved_values_per_token() - whole) / c.tp;
  double streamed = tokens * blocks * values * bytes.activation * (3.0 + recomputed) +
                    bytes.update * share.params / c.optimizer_shards();
  if (share.head) streamed += tokens * 3.0 * static_cast<double>(m.vocab) / c.tp * 4.0;
  StageTime t;
  t.compute = flops / p.achieved_flops(job.precision == "fp32" ? "fp32" : "bf16") +
              streamed / (p.memory_bandwidth * p.share());
  // Operators: about 60 per block and microbatch (20 forward, 40 backward; 20 more recomputed),
  // 20 for the embeddings, head and loss, and the optimizer's per parameter tensor and step.
  const double tensors = blocks * (m.arch == Arch::Gpt ? 16.0 : 9.0) + 4.0;
  const double ops = c.microbatches * (blocks * (60.0 + 20.0 * recomputed) + 20.0) + bytes.ops_per_tensor * tensors;
  t.compute += ops * p.op_overhead_s;
  t.backward = t.compute * (4.0 + 2.0 * recomputed) / (6.0 + 2.0 * recomputed);
  const double activation = tokens / c.microbatches * static_cast<double>(m.dim) * bytes.activation;
  // Selective checkpointing saves the collectives' outputs: only full recomputation repeats them.
  const double per_block = (c.checkpointing == Checkpointing::Full ? 6.0 : 4.0) * allreduce(p, activation, c.tp, 1);
  t.tp_comm = c.microbatches * (blocks * per_block + (share.embedding ? allreduce(p, activation, c.tp, 1) : 0.0));
  return t;
}

}  // namespace

StepTime step_time(const Job& job, const Configuration& c) {
  const Profile& p = job.profile;
  const StateBytes bytes = state_bytes(job.precision, job.optimizer);
  StageTime slowest;
  double params = 0;  // the slowest stage's parameters per rank: what its data-parallel group moves
  for (int stage = 0; stage < c.pp; ++stage) {
    const StageTime t = stage_time(job, c, stage);
    if (stage == 0 || t.compute + t.tp_comm > slowest.compute + slowest.tp_comm) {
      slowest = t;
      params = stage_share(job.model, c, stage).params;
    }
  }
  const double grads = bytes.gradient * params, weights = bytes.weight * params;
  double hideable = 0, exposed = 0, window = p.overlap * slowest.backward;
  if (c.sharding == "ddp") {
    hideable = allreduce(p, grads, c.dp, c.tp);
  } else if (c.sharding == "zero1") {
    hideable = allreduce(p, grads, c.dp, c.tp);
    exposed = half(p, weights, c.dp, c.tp);
  } else if (c.sharding == "zero2") {
    hideable = half(p, grads, c.dp, c.tp);
    exposed = half(p, weights, c.dp, c.tp);
  } else {  // fsdp, hsdp: shard groups are adjacent data-parallel ranks, replicas stride over them
    hideable = c.microbatches * (2 * half(p, weights, c.shard, c.tp) + half(p, grads, c.shard, c.tp));
    if (c.sharding == "hsdp") hideable += allreduce(p, grads / c.shard, c.dp / c.shard, c.tp * c.shard);
    window = p.overlap * slowest.compute;
  }
  StepTime t;
  t.compute = slowest.compute;
  double p2p = 0;
  if (c.pp > 1) {
    const double activation = static_cast<double>(c.local_batch) / c.microbatches *
                              static_cast<double>(job.model.seq) * static_cast<double>(job.model.dim) * bytes.activation;
    const bool across_nodes = c.tp * c.dp >= p.devices_per_node;
    const bench::Link& link = across_nodes && p.nodes > 1 ? p.inter : p.intra;
    p2p = 2.0 * c.microbatches * (link.alpha_s + activation / link.busbw_Bps);
  }
  t.exposed_comm = std::max(0.0, hideable - window) + exposed + slowest.tp_comm + p2p;
  t.comm = hideable + exposed + slowest.tp_comm + p2p;
  t.bubble = c.pp > 1 ? (c.pp - 1.0) / c.microbatches * (slowest.compute + slowest.tp_comm) : 0.0;
  return t;
}

}  // namespace tandem::plan
