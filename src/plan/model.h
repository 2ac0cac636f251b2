#pragma once
// What `tandem plan` plans for: a decoder-only transformer by its dimensions (Note [Planned
// models] in model.cpp). Pure arithmetic: no LibTorch, nothing allocated.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::plan {

/// The two block designs whose memory and FLOPs the planner knows layer for layer.
enum class Arch {
  Gpt,    // bench/workloads.h's GPT: LayerNorm and biased linears, learned positions, GELU MLP of ffn
  Llama,  // Llama 3 as torchtitan builds it: RMSNorm, no biases, RoPE, grouped-query attention, SwiGLU
};

struct Model {
  std::string name;  // "llama3-8b", "gpt-cpu-10", or "custom"
  Arch arch = Arch::Gpt;
  int64_t layers = 0, dim = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 0;

  int64_t head_dim() const { return dim / heads; }
  int64_t kv_dim() const { return kv_heads * head_dim(); }
  /// Parameters by place: the embeddings (token, and learned positions for Gpt), one block, the
  /// final norm and the output head (never tied).
  int64_t embedding_params() const;
  int64_t block_params() const;
  int64_t final_params() const;  // final norm + head
  int64_t params() const { return embedding_params() + layers * block_params() + final_params(); }
  /// The weights a matmul multiplies per token (every block's linears and the head; not the
  /// embeddings, which are gathered): 2 FLOPs each forward, 4 backward.
  int64_t matmul_params() const;
  /// Values autograd keeps per token for one block's backward (Note [Planned models]), and per
  /// token for the loss (logits over the vocabulary).
  double block_saved_values_per_token() const;
  /// Under torchtitan's per-op selective checkpointing (Note [Planned models]): the values a block
  /// keeps per token, and the share of its matmul FLOPs recomputed in backward.
  double selective_saved_values_per_token() const;
  double selective_whole_values_per_token() const;  // of those, whole on every TP rank without SP
  double selective_recomputed_share() const;
  std::string describe() const;  // "L32 d4096 h32/8 ffn14336 V128256 s8192 (llama, 8.03 B params)"
};

/// A model by name: "llama3-8b", "llama3-70b", "llama3-405b" (torchtitan's, sequence 8192), and the
/// memory frontier's family members "gpt-cpu-N" (N = 0..15) and "gpt-tiny-N" (0..5). Throws
/// tandem::Error naming the known ones.
Model model_by_name(const std::string& name);
/// Member `index` of `tandem bench --memory-budget`'s GPT family at `scale` ("cpu": 16 members,
/// "tiny": 6), the one definition the frontier's probes train.
Model frontier_family_model(const std::string& scale, int index);
std::vector<std::string> model_names();

/// Checks a model's dimensions (positive; heads divide the width; kv_heads divide heads): throws
/// tandem::Error with one line naming the first that fails.
void check_model(const Model& model);

}  // namespace tandem::plan
