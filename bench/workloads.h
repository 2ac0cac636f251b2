#pragma once
// The benchmark workloads, defined layer for layer as in bench/peer.py: same modules, same
// registered names, same shapes, so the same parameter count at every scale (the record's
// "params"; tests/bench/worker_records.sh checks the two are equal).
//
//   small   an MLP on [B,1,28,28] flattened: tiny 784-32-10; cpu and full 784-512-256-10
//   medium  ResNet-18's topology with the CIFAR stem, widths w,2w,4w,8w, on [B,3,H,H]:
//           tiny w=4 H=16; cpu w=16 H=32; full w=64 H=32 (the real ResNet-18, 11.2 M)
//   large   a GPT-style pre-LN decoder on [B,T] tokens, next-token loss over every position:
//           tiny V=128 T=16 d=32 L=3 heads=2; cpu V=4096 T=64 d=192 L=4 heads=6;
//           full V=8192 T=256 d=512 L=8 heads=8
//
// The GPT's layers that tensor parallelism cuts are tandem::nn::Hookable (gpt_tp_plan); under the
// other strategies a Hookable only calls its layer. Every model's forward takes one tensor and
// returns one (DataParallel needs that); the loss is cross entropy over the output flattened to
// [-1, classes] against the target flattened to [-1] (a classifier's [B,10] / [B] unchanged; the
// GPT's [B,T,V] / [B,T]).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "tandem/error.h"
#include "tandem/fsdp/unit.h"
#include "tandem/nn/hookable.h"
#include "tandem/pp/sequential_slice.h"
#include "tandem/tp/style.h"

namespace tandem::bench {

inline bool is_scale(const std::string& scale) { return scale == "tiny" || scale == "cpu" || scale == "full"; }

// ---- small: MLP --------------------------------------------------------------------------------

inline std::vector<int64_t> mlp_dims(const std::string& scale) {
  if (scale == "tiny") return {784, 32, 10};
  return {784, 512, 256, 10};
}

/// Linear layers fc0, fc1, ... with ReLU between them.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const std::vector<int64_t>& dims) {
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      layers.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(dims[i], dims[i + 1])));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x.flatten(1);
    for (size_t i = 0; i < layers.size(); ++i) {
      h = layers[i](h);
      if (i + 1 < layers.size()) h = h.relu();
    }
    return h;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(Mlp);

// ---- medium: ResNet-18 topology, CIFAR stem ----------------------------------------------------

struct ResNetConfig {
  int64_t width = 16;  // w: stage widths w, 2w, 4w, 8w
  int64_t image = 32;  // H: input [B,3,H,H]
};

inline ResNetConfig resnet_config(const std::string& scale) {
  if (scale == "tiny") return {4, 16};
  if (scale == "cpu") return {16, 32};
  return {64, 32};
}

inline torch::nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

/// conv3x3-BN-ReLU-conv3x3-BN plus the shortcut (identity, or 1x1 conv + BN when the shape
/// changes), then ReLU.
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", conv3x3(in, out, stride))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module("conv2", conv3x3(out, out, 1))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      downsample = register_module(
          "downsample",
          torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                torch::nn::BatchNorm2d(out)));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = bn1(conv1(x)).relu();
    h = bn2(conv2(h));
    return (h + (downsample ? downsample->forward(x) : x)).relu();
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNetImpl : torch::nn::Module {
  explicit ResNetImpl(const ResNetConfig& c)
      : conv1(register_module("conv1", conv3x3(3, c.width, 1))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(c.width))),
        layer1(register_module("layer1", stage(c.width, c.width, 1))),
        layer2(register_module("layer2", stage(c.width, 2 * c.width, 2))),
        layer3(register_module("layer3", stage(2 * c.width, 4 * c.width, 2))),
        layer4(register_module("layer4", stage(4 * c.width, 8 * c.width, 2))),
        fc(register_module("fc", torch::nn::Linear(8 * c.width, 10))) {}
  static torch::nn::Sequential stage(int64_t in, int64_t out, int64_t stride) {
    return torch::nn::Sequential(BasicBlock(in, out, stride), BasicBlock(out, out, 1));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = bn1(conv1(x)).relu();
    h = layer4->forward(layer3->forward(layer2->forward(layer1->forward(h))));
    return fc(at::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Sequential layer1, layer2, layer3, layer4;
  torch::nn::Linear fc;
};
TORCH_MODULE(ResNet);

// ---- large: GPT-style decoder ------------------------------------------------------------------

struct GptConfig {
  int64_t vocab = 4096, context = 64, dim = 192, layers = 4, heads = 6;
};

inline GptConfig gpt_config(const std::string& scale) {
  if (scale == "tiny") return {128, 16, 32, 3, 2};  // 3 blocks: a pipeline of 4 stages (2 x 2 interleaved)
  if (scale == "cpu") return {4096, 64, 192, 4, 6};
  return {8192, 256, 512, 8, 8};
}

/// A layer a tensor-parallel plan can cut (gpt_tp_plan): the plain layer under every other strategy.
template <typename Layer>
tandem::nn::Hookable cuttable(Layer layer) {
  return tandem::nn::Hookable(std::move(layer));
}

/// Pre-LN: x + proj(causal attention(ln1(x))), then x + fc2(gelu(fc1(ln2(x)))). q, k and v are
/// separate layers (one fused qkv would mix them when cut by columns, as torchtitan keeps them).
struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(int64_t dim, int64_t heads)
      : head_dim(dim / heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        q(register_module("q", cuttable(torch::nn::Linear(dim, dim)))),
        k(register_module("k", cuttable(torch::nn::Linear(dim, dim)))),
        v(register_module("v", cuttable(torch::nn::Linear(dim, dim)))),
        proj(register_module("proj", cuttable(torch::nn::Linear(dim, dim)))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc1(register_module("fc1", cuttable(torch::nn::Linear(dim, 4 * dim)))),
        fc2(register_module("fc2", cuttable(torch::nn::Linear(4 * dim, dim)))) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1);
    // [B,T,d] -> [B,heads,T,d/heads]: as many heads as q gives (heads / tp of them under TP).
    auto split = [&](const at::Tensor& y) { return y.view({b, t, -1, head_dim}).transpose(1, 2); };
    const at::Tensor normed = ln1(x);
    at::Tensor y = at::scaled_dot_product_attention(split(q(normed)), split(k(normed)), split(v(normed)),
                                                    /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
    at::Tensor h = x + proj(y.transpose(1, 2).reshape({b, t, -1}));
    return h + fc2(at::gelu(fc1(ln2(h))));
  }
  int64_t head_dim;
  torch::nn::LayerNorm ln1;
  tandem::nn::Hookable q, k, v, proj;
  torch::nn::LayerNorm ln2;
  tandem::nn::Hookable fc1, fc2;
};
TORCH_MODULE(GptBlock);

// The token embedding and the head (half the parameters at the cpu scale) are FSDP units of
// their own, as torchtitan shards them; under the other strategies a Unit only calls its module.
struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& c)
      : tok_emb(register_module("tok_emb", tandem::fsdp::Unit(cuttable(torch::nn::Embedding(c.vocab, c.dim))))),
        pos_emb(register_module("pos_emb", torch::nn::Embedding(c.context, c.dim))),
        blocks(register_module("blocks", torch::nn::Sequential())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        head(register_module("head", tandem::fsdp::Unit(cuttable(torch::nn::Linear(c.dim, c.vocab))))) {
    for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(GptBlock(c.dim, c.heads));
  }
  /// tokens [B,T] (T <= context) -> logits [B,T,V] (under gpt_tp_plan: [B,T,V/tp], this rank's classes)
  at::Tensor forward(const at::Tensor& tokens) {
    at::Tensor positions = at::arange(tokens.size(1), tokens.options().dtype(at::kLong));
    at::Tensor h = tok_emb(tokens) + pos_emb(positions);
    return head(ln_f(blocks->forward(h)));
  }
  tandem::fsdp::Unit tok_emb;
  torch::nn::Embedding pos_emb;
  torch::nn::Sequential blocks;
  torch::nn::LayerNorm ln_f;
  tandem::fsdp::Unit head;
};
TORCH_MODULE(Gpt);

/// Stage `stage` of `stages` of a Gpt, for pipeline parallelism (the pp-* strategies): its blocks
/// (pp::stage_blocks), the embeddings on the first stage, the final LayerNorm and the head on the
/// last, under the whole model's names and sharing its parameters. Every stage but the last needs
/// a block (gpt_pipeline_refusal).
struct GptStageImpl : torch::nn::Module {
  GptStageImpl(const Gpt& whole, int64_t stage, int64_t stages) {
    if (stage == 0) {
      tok_emb = register_module("tok_emb", whole->tok_emb);
      pos_emb = register_module("pos_emb", whole->pos_emb);
    }
    const auto [first, last] = tandem::pp::stage_blocks(static_cast<int64_t>(whole->blocks->size()), stage, stages);
    blocks = register_module("blocks", tandem::pp::SequentialSlice(whole->blocks, first, last));
    if (stage == stages - 1) {
      ln_f = register_module("ln_f", whole->ln_f);
      head = register_module("head", whole->head);
    }
  }
  /// tokens [B,T] on the first stage, the hidden state [B,T,d] after it -> the next stage's input
  /// (the logits [B,T,V] on the last)
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = tok_emb ? tok_emb(x) + pos_emb(at::arange(x.size(1), x.options().dtype(at::kLong))) : x;
    h = blocks(h);
    return head ? head(ln_f(h)) : h;
  }
  tandem::fsdp::Unit tok_emb{nullptr};
  torch::nn::Embedding pos_emb{nullptr};
  tandem::pp::SequentialSlice blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  tandem::fsdp::Unit head{nullptr};
};
TORCH_MODULE(GptStage);

/// Why the GPT at `scale` cannot be cut into `stages` pipeline stages, or "": every stage but
/// the last must hold a block (the last holds at least the head). peer.py says the same.
inline std::string gpt_pipeline_refusal(const std::string& scale, int64_t stages) {
  const int64_t layers = gpt_config(scale).layers;
  if (layers >= stages - 1) return "";
  return "the " + scale + " GPT's " + std::to_string(layers) + " blocks cannot fill " + std::to_string(stages) +
         " pipeline stages (every stage but the last needs one)";
}

/// Megatron's plan for the GPT (tiny_gpt's, and peer.py's parallelize_module plan): the embedding
/// by vocabulary rows, attention by heads (q, k, v by columns, proj by rows), the MLP by its
/// hidden features, the head by classes, kept cut for the vocab-parallel loss. The norms, the
/// position embedding and the residual stream stay whole on every rank. Heads and the vocabulary
/// must divide by the group's size.
inline tandem::tp::Plan gpt_tp_plan() {
  namespace tp = tandem::tp;
  return {{"tok_emb", tp::RowwiseParallel()},     {"blocks.*.[qkv]", tp::ColwiseParallel()},
          {"blocks.*.proj", tp::RowwiseParallel()}, {"blocks.*.fc1", tp::ColwiseParallel()},
          {"blocks.*.fc2", tp::RowwiseParallel()},  {"head", tp::ColwiseParallel()}};
}

// ---- data and loss -----------------------------------------------------------------------------

/// A random [B,T+1] token sequence for the GPT `c` from a generator seeded with `seed`: input its
/// first T tokens, target the next token at each position (also the memory frontier's batch).
inline std::pair<at::Tensor, at::Tensor> synthetic_batch_gpt(const GptConfig& c, int64_t batch, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor seq = at::randint(0, c.vocab, {batch, c.context + 1}, gen);
  return {seq.slice(1, 0, c.context).contiguous(), seq.slice(1, 1).contiguous()};
}

/// One fixed synthetic batch of `batch` samples for `model` at `scale`, on the CPU, from a
/// generator seeded with `seed` (the same values as bench/peer.py's torch.Generator draws):
/// small [B,1,28,28] and medium [B,3,H,H] normal images with labels in [0,10); large: a random
/// [B,T+1] token sequence, input its first T tokens, target the next token at each position.
inline std::pair<at::Tensor, at::Tensor> synthetic_batch(const std::string& model, const std::string& scale,
                                                         int64_t batch, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (model == "small") {
    at::Tensor x = at::randn({batch, 1, 28, 28}, gen);
    return {x, at::randint(0, 10, {batch}, gen)};
  }
  if (model == "medium") {
    const auto c = resnet_config(scale);
    at::Tensor x = at::randn({batch, 3, c.image, c.image}, gen);
    return {x, at::randint(0, 10, {batch}, gen)};
  }
  if (model == "large") return synthetic_batch_gpt(gpt_config(scale), batch, seed);
  throw Error("unknown model '" + model + "' (expected small, medium or large)");
}

/// Cross entropy of `output` [..., classes] against `target` [...] over every position.
inline at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target) {
  return at::cross_entropy_loss(output.reshape({-1, output.size(-1)}), target.reshape({-1}));
}

}  // namespace tandem::bench
