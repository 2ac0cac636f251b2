#include "plan/model.h"

#include <cstdio>
#include <map>

#include "tandem/error.h"

namespace tandem::plan {

// Note [Planned models]
// The planner knows two block designs layer for layer, so that its parameter counts are exact
// (the frontier's GPT: tests compare them with the worker's own count; Llama 3: 8,030,261,248
// parameters at 8B, Meta's figure) and its activation memory is what autograd keeps:
// - Gpt (bench/workloads.h): per token, a block keeps for backward its input and ln1's output
//   (the q, k, v matmuls' input), q, k and v (scaled_dot_product_attention's inputs), the
//   attention's output and its reshaped copy (proj's input), the residual sum h and ln2's output,
//   fc1's output (GELU's input) and GELU's output (fc2's input): 9d + 2 ffn values, plus one
//   log-sum-exp per head.
// - Llama (torchtitan's model): the norms' inputs and outputs (4d), RoPE's float32 copies of q and
//   k (2(d + kv) in 16-bit units), the attention's q, k, v and output (d + 2kv + d), wo's input (d),
//   and SwiGLU's w1 and w3 outputs, the SiLU and the product (4 ffn): 9d + 4kv + 4 ffn, plus one
//   log-sum-exp per head.
// Four d of each (the norms' inputs and outputs) are whole on every tensor-parallel rank, unless
// sequence parallelism (tp::SequenceParallel on the norms, torchtitan's plan) cuts them and the
// residual stream by sequence; the rest is cut with the heads and the FFN columns. The loss keeps, per token, three float32 rows of the
// vocabulary at its peak (log-softmax's output, and its gradient and the logits' in backward).
// torchtitan's per-op selective checkpointing (activation_checkpoint.py, mode "selective", "op")
// keeps the attention's output and every other matmul's output, counted per block in call order,
// and the block's input: the first, third, fifth and seventh matmul (Gpt: q, v, fc1; Llama: wq,
// wv, w1, w2). Backward recomputes the others (Gpt: k, proj, fc2; Llama: wk, wo, w3). Float8 is
// not modelled.

int64_t Model::embedding_params() const {
  return vocab * dim + (arch == Arch::Gpt ? seq * dim : 0);
}

int64_t Model::block_params() const {
  const int64_t d = dim;
  if (arch == Arch::Gpt) {  // ln1, q, k, v, proj, ln2, fc1, fc2
    return 2 * d + 3 * (d * d + d) + (d * d + d) + 2 * d + (d * ffn + ffn) + (ffn * d + d);
  }
  return d + d * d + 2 * d * kv_dim() + d * d + d + 3 * d * ffn;  // norms, wq wk wv wo, w1 w2 w3
}

int64_t Model::final_params() const {
  return arch == Arch::Gpt ? 2 * dim + dim * vocab + vocab : dim + dim * vocab;
}

int64_t Model::matmul_params() const {
  const int64_t d = dim;
  const int64_t block = arch == Arch::Gpt ? 4 * d * d + 2 * d * ffn : 2 * d * d + 2 * d * kv_dim() + 3 * d * ffn;
  return layers * block + d * vocab;
}

double Model::block_saved_values_per_token() const {
  const double d = static_cast<double>(dim), f = static_cast<double>(ffn);
  if (arch == Arch::Gpt) return 9 * d + 2 * f + static_cast<double>(heads);
  return 9 * d + 4 * static_cast<double>(kv_dim()) + 4 * f + static_cast<double>(heads);
}

double Model::selective_saved_values_per_token() const {
  const double d = static_cast<double>(dim), f = static_cast<double>(ffn), h = static_cast<double>(heads);
  if (arch == Arch::Gpt) return d + (d + d + f) + d + h;  // input; q, v, fc1; attention's output and lse
  return d + (d + static_cast<double>(kv_dim()) + f + d) + d + h;  // input; wq, wv, w1, w2; attention
}

// The block's input, and Llama's w2 output (a row-parallel matmul's, all-reduced): the rest of
// what the selective policy keeps is cut with the heads and the FFN columns.
double Model::selective_whole_values_per_token() const {
  return (arch == Arch::Gpt ? 1.0 : 2.0) * static_cast<double>(dim);
}

double Model::selective_recomputed_share() const {
  const double d = static_cast<double>(dim), f = static_cast<double>(ffn), kv = static_cast<double>(kv_dim());
  if (arch == Arch::Gpt) return (d * d + d * d + f * d) / (4 * d * d + 2 * d * f);
  return (d * kv + d * d + d * f) / (2 * d * d + 2 * d * kv + 3 * d * f);
}

std::string Model::describe() const {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "L%lld d%lld h%lld/%lld ffn%lld V%lld s%lld (%s, %.3g B params)",
                static_cast<long long>(layers), static_cast<long long>(dim), static_cast<long long>(heads),
                static_cast<long long>(kv_heads), static_cast<long long>(ffn), static_cast<long long>(vocab),
                static_cast<long long>(seq), arch == Arch::Gpt ? "gpt" : "llama", static_cast<double>(params()) / 1e9);
  return buf;
}

void check_model(const Model& m) {
  const std::map<std::string, int64_t> sizes{{"layers", m.layers}, {"dim", m.dim},     {"heads", m.heads},
                                             {"kv-heads", m.kv_heads}, {"ffn", m.ffn}, {"vocab", m.vocab},
                                             {"seq", m.seq}};
  for (const auto& [name, value] : sizes) {
    TANDEM_CHECK(value > 0, "model ", m.name, ": --", name, " must be positive (got ", value, ")");
  }
  // Bounds well past any model trained so far, so that the counts below stay exact in int64.
  const std::map<std::string, std::pair<int64_t, int64_t>> bounds{{"layers", {m.layers, 100000}}, {"dim", {m.dim, 1 << 20}},
                                                                  {"ffn", {m.ffn, 1 << 22}},     {"vocab", {m.vocab, 1 << 24}},
                                                                  {"seq", {m.seq, 1 << 24}}};
  for (const auto& [name, value_and_bound] : bounds) {
    TANDEM_CHECK(value_and_bound.first <= value_and_bound.second, "model ", m.name, ": --", name, " ",
                 value_and_bound.first, " is above ", value_and_bound.second);
  }
  TANDEM_CHECK(m.dim % m.heads == 0, "model ", m.name, ": --dim ", m.dim, " is not a multiple of --heads ", m.heads);
  TANDEM_CHECK(m.heads % m.kv_heads == 0, "model ", m.name, ": --heads ", m.heads, " is not a multiple of --kv-heads ",
               m.kv_heads);
  TANDEM_CHECK(m.arch == Arch::Llama || m.kv_heads == m.heads, "model ", m.name,
               ": the gpt design has no grouped-query attention (--kv-heads must equal --heads)");
}

namespace {

Model llama(const std::string& name, int64_t layers, int64_t dim, int64_t heads, int64_t ffn) {
  return Model{name, Arch::Llama, layers, dim, heads, 8, ffn, 128256, 8192};
}

}  // namespace

Model frontier_family_model(const std::string& scale, int index) {
  TANDEM_CHECK(scale == "tiny" || scale == "cpu", "the frontier's family is tiny or cpu (got ", scale, ")");
  const int size = scale == "tiny" ? 6 : 16;
  TANDEM_CHECK(index >= 0 && index < size, "the ", scale, " family has members 0 to ", size - 1, " (got ", index, ")");
  const std::string name = "gpt-" + scale + "-" + std::to_string(index);
  if (scale == "tiny") return Model{name, Arch::Gpt, index + 1, 1024, 2, 2, 4 * 1024, 64, 8};
  const int64_t dim = 128 + 32 * index;
  return Model{name, Arch::Gpt, 2 + index, dim, 4, 4, 4 * dim, 2048, 128};
}

Model model_by_name(const std::string& name) {
  // Llama 3 as torchtitan defines it: ffn from dim, ffn_dim_multiplier and multiple_of.
  if (name == "llama3-8b") return llama(name, 32, 4096, 32, 14336);
  if (name == "llama3-70b") return llama(name, 80, 8192, 64, 28672);
  if (name == "llama3-405b") return llama(name, 126, 16384, 128, 53248);
  for (const std::string scale : {"cpu", "tiny"}) {
    const std::string prefix = "gpt-" + scale + "-";
    if (name.rfind(prefix, 0) == 0 && name.size() > prefix.size() &&
        name.find_first_not_of("0123456789", prefix.size()) == std::string::npos && name.size() - prefix.size() <= 3) {
      return frontier_family_model(scale, std::stoi(name.substr(prefix.size())));
    }
  }
  std::string known;
  for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown model '" + name + "' (known: " + known + "; or give --layers, --dim, --heads, --vocab, --seq)");
}

std::vector<std::string> model_names() {
  return {"llama3-8b", "llama3-70b", "llama3-405b", "gpt-cpu-0 .. gpt-cpu-15", "gpt-tiny-0 .. gpt-tiny-5"};
}

}  // namespace tandem::plan
