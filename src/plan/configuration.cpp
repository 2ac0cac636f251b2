#include "plan/configuration.h"

#include <algorithm>
#include <cstdio>

#include "tandem/error.h"

namespace tandem::plan {

// Note [Configurations]
// The devices are laid out as torchtitan's mesh [pp, replicate, shard, tp] (row-major, tp
// innermost) and as Tandem's ParallelismConfig builds it: a tensor-parallel group is adjacent
// devices, a data-parallel group strides over them, the pipeline's stages are the outermost cut.
// The model state per rank follows the ZeRO paper: ZeRO-1 cuts the optimizer state over the
// data-parallel group, ZeRO-2 the gradients too, FSDP everything; HSDP cuts over `shard` and
// replicates across dp / shard. A pipeline stage holds layers / pp blocks (the first stages one
// more where they do not divide), the first stage the embeddings, the last the final norm and head.

std::string Configuration::name() const {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s dp%d%s tp%d%s pp%d %s m%d", sharding.c_str(), dp,
                sharding == "hsdp" ? ("/" + std::to_string(shard)).c_str() : "", tp,
                sequence_parallel && tp > 1 ? "sp" : "", pp, to_string(checkpointing), microbatches);
  return buf;
}

const char* to_string(Checkpointing c) {
  return c == Checkpointing::None ? "-" : c == Checkpointing::Selective ? "sac" : "ckpt";
}

Checkpointing parse_checkpointing(const std::string& text) {
  if (text == "none") return Checkpointing::None;
  if (text == "selective") return Checkpointing::Selective;
  TANDEM_CHECK(text == "full", "--checkpointing: none, selective or full (got ", text, ")");
  return Checkpointing::Full;
}

int Configuration::weight_shards() const { return sharding == "fsdp" || sharding == "hsdp" ? shard : 1; }
int Configuration::gradient_shards() const { return sharding == "zero1" || sharding == "ddp" ? 1 : shard; }
int Configuration::optimizer_shards() const { return sharding == "ddp" ? 1 : shard; }

StageShare stage_share(const Model& m, const Configuration& c, int stage) {
  TANDEM_CHECK(stage >= 0 && stage < c.pp, "stage ", stage, " of ", c.pp);
  StageShare s;
  s.blocks = m.layers / c.pp + (stage < m.layers % c.pp ? 1 : 0);
  s.embedding = stage == 0;
  s.head = stage == c.pp - 1;
  const double tp = c.tp;
  const double block = static_cast<double>(m.block_params()) / tp;
  const double embedding = static_cast<double>(m.embedding_params()) / tp;
  const double final = static_cast<double>(m.final_params()) / tp;
  s.params = static_cast<double>(s.blocks) * block + (s.embedding ? embedding : 0) + (s.head ? final : 0);
  const double block_matmul = static_cast<double>(m.matmul_params() - m.dim * m.vocab) / m.layers / tp;
  s.matmul_params = static_cast<double>(s.blocks) * block_matmul + (s.head ? static_cast<double>(m.dim * m.vocab) / tp : 0);
  s.largest_unit_params = std::max({s.blocks > 0 ? block : 0.0, s.embedding ? embedding : 0.0, s.head ? final : 0.0});
  return s;
}

double whole_values_per_token(const Model& m, const Configuration& c) {
  return c.sequence_parallel ? 0.0 : 4.0 * static_cast<double>(m.dim);
}

StateBytes state_bytes(const std::string& precision, const std::string& optimizer) {
  TANDEM_CHECK(precision == "fp32" || precision == "bf16", "--precision: fp32 or bf16 (got ", precision, ")");
  TANDEM_CHECK(optimizer == "adam" || optimizer == "sgd", "--optimizer: adam or sgd (got ", optimizer, ")");
  const bool adam = optimizer == "adam", fp32 = precision == "fp32";
  StateBytes b;
  b.weight = b.gradient = b.activation = fp32 ? 4 : 2;
  b.optimizer = (adam ? 8 : 4) + (fp32 ? 0 : 4);  // moments, and the float32 master weights
  b.update = adam ? 28 : 20;  // Adam: read weight, gradient, two moments; write three. SGD: 3 + 2
  b.ops_per_tensor = adam ? 12 : 5;
  return b;
}

}  // namespace tandem::plan
