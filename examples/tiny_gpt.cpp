// A small GPT trained with the Accelerator, fully sharded by default: each transformer block, the
// token embedding and the head are FSDP units, gathered just before they run and freed after, so
// each process keeps only its share of the weights, gradients and Adam's state between steps.
//
//   tandem run --nproc-per-node 4 -- ./tiny_gpt [--epochs 2] [--strategy fsdp|ddp|single|auto]
//       [--layers 4] [--dim 128] [--batch-size 16] [--mixed-precision no|bf16|fp16]
//       [--checkpoints DIR] [--checkpointing-steps N] [--resume-from DIR]
//       [--dropout P] [--activation-checkpointing [--checkpoint-every N]] [--tp N]
//       [--pp N [--schedule gpipe|1f1b|interleaved] [--microbatches M]]
//
// --tp N cuts every block over groups of N neighbouring processes (tensor parallelism, Megatron's
// plan: attention's heads and the MLP's hidden features divided by N, the embedding's vocabulary
// and the head's classes too, the loss computed on the cut logits); the other processes' factor
// is the strategy's (FSDP or DDP). Each group shares its batches, so `--nproc-per-node 4 --tp 2`
// trains on the batches of 2 processes, as `--nproc-per-node 2` does, to the same loss.
//
// --pp N cuts the model by layers into N stages (2N with --schedule interleaved), each on its own
// process of a pipeline of N (tandem/pp/, docs/guide-pp.md): the embeddings and the first blocks on
// the first, the last blocks, the final LayerNorm and the head on the last; each step's batch runs
// in M microbatches (default 2N). The other processes' factor is the strategy's, as with --tp, so
// `--nproc-per-node 4 --pp 2` trains on the batches of 2 processes, as `--nproc-per-node 2` does,
// to the same loss. The stages keep the whole model's names, so a checkpoint resumes at another
// --pp, or without one.
//
// --activation-checkpointing recomputes each block's forward (every N-th with --checkpoint-every)
// in backward instead of keeping its activations (tandem/nn/checkpoint.h): the same training, bit
// for bit (dropout's masks drawn again from the same generator state), for less memory.
//
// The text is a synthetic language, the same on every process: each of 64 tokens is followed by
// one of two successors, with equal odds. A model that learned it predicts the next token with a
// loss of ln 2 = 0.69 nats; guessing among 64 tokens costs ln 64 = 4.16. The program prints the
// held-out loss beside both. A checkpoint resumes under any number of processes and any --tp (its
// weights and Adam's state are saved by name, as pieces of the whole tensors): the rest of its
// epoch is shared among the new data-parallel ranks.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>

#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/prepared_pipeline.h"
#include "tandem/fsdp/auto_wrap.h"
#include "tandem/fsdp/unit.h"
#include "tandem/nn/hookable.h"
#include "tandem/pp/sequential_slice.h"
#include "tandem/tp/loss_parallel.h"
#include "tandem/tp/parallelize.h"

namespace {

constexpr int64_t kVocab = 64;

// The layers a tensor-parallel plan cuts are Hookable (tandem/nn/hookable.h): the plan runs its
// collectives around their forwards. Without a plan they are the plain layers.
tandem::nn::Hookable linear(int64_t in, int64_t out) { return tandem::nn::Hookable(torch::nn::Linear(in, out)); }

// Pre-LN block: x + proj(causal attention(ln1(x))), then x + fc2(gelu(fc1(ln2(x)))).
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t heads, double dropout)
      : torch::nn::Module("Block"),
        head_dim(dim / heads),
        dropout(dropout),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        q(register_module("q", linear(dim, dim))),
        k(register_module("k", linear(dim, dim))),
        v(register_module("v", linear(dim, dim))),
        proj(register_module("proj", linear(dim, dim))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc1(register_module("fc1", linear(dim, 4 * dim))),
        fc2(register_module("fc2", linear(4 * dim, dim))) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1);
    // As many heads as q gives (heads / tp of them under tensor parallelism).
    auto split = [&](const at::Tensor& y) { return y.view({b, t, -1, head_dim}).transpose(1, 2); };
    const at::Tensor normed = ln1(x);
    at::Tensor y = at::scaled_dot_product_attention(split(q(normed)), split(k(normed)), split(v(normed)),
                                                    /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
    at::Tensor h = x + drop(proj(y.transpose(1, 2).reshape({b, t, -1})));
    return h + drop(fc2(at::gelu(fc1(ln2(h)))));
  }
  at::Tensor drop(const at::Tensor& x) { return dropout > 0 ? at::dropout(x, dropout, is_training()) : x; }
  int64_t head_dim;
  double dropout;
  torch::nn::LayerNorm ln1;
  tandem::nn::Hookable q, k, v, proj;
  torch::nn::LayerNorm ln2;
  tandem::nn::Hookable fc1, fc2;
};
TORCH_MODULE(Block);

// The units: every block (wrap_entries), the embedding and the head. What is in no unit (the
// position embedding, the last LayerNorm) is the root unit's, gathered for the whole step.
struct GptImpl : torch::nn::Module {
  GptImpl(int64_t context, int64_t dim, int64_t layers, int64_t heads, double dropout)
      : tok_emb(register_module("tok_emb",
                                tandem::fsdp::Unit(tandem::nn::Hookable(torch::nn::Embedding(kVocab, dim))))),
        pos_emb(register_module("pos_emb", torch::nn::Embedding(context, dim))),
        blocks(register_module("blocks", torch::nn::Sequential())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        head(register_module("head", tandem::fsdp::Unit(linear(dim, kVocab)))) {
    for (int64_t i = 0; i < layers; ++i) blocks->push_back(Block(dim, heads, dropout));
    tandem::fsdp::wrap_entries(*blocks);
  }
  at::Tensor forward(const at::Tensor& tokens) {  // [B,T] -> logits [B,T,V]
    at::Tensor h = tok_emb(tokens) + pos_emb(at::arange(tokens.size(1), tokens.options()));
    return head(ln_f(blocks->forward(h)));
  }
  tandem::fsdp::Unit tok_emb;
  torch::nn::Embedding pos_emb;
  torch::nn::Sequential blocks;
  torch::nn::LayerNorm ln_f;
  tandem::fsdp::Unit head;
};
TORCH_MODULE(Gpt);

// One pipeline stage of a Gpt: its blocks (pp::stage_blocks), with the embeddings on the first
// stage and the final LayerNorm and the head on the last, registered under the whole model's
// names ("blocks.3...") so that checkpoints are the whole model's (Note [Pipeline checkpoints]).
struct GptStageImpl : torch::nn::Module {
  GptStageImpl(const Gpt& whole, int64_t stage, int64_t stages, int64_t layers) {
    const bool first = stage == 0, last = stage == stages - 1;
    if (first) {
      tok_emb = register_module("tok_emb", whole->tok_emb);
      pos_emb = register_module("pos_emb", whole->pos_emb);
    }
    const auto [first_block, last_block] = tandem::pp::stage_blocks(layers, stage, stages);
    blocks = register_module("blocks", tandem::pp::SequentialSlice(whole->blocks, first_block, last_block));
    if (last) {
      ln_f = register_module("ln_f", whole->ln_f);
      head = register_module("head", whole->head);
    }
  }
  at::Tensor forward(const at::Tensor& x) {  // tokens [B,T] on the first stage; hidden [B,T,D] after
    at::Tensor h = tok_emb ? tok_emb(x) + pos_emb(at::arange(x.size(1), x.options())) : x;
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

// `count` sequences of the synthetic language: inputs [N,T] and the next token at each position
// [N,T]. The successor table is fixed (seed 7); the sequences come from `seed`.
std::pair<at::Tensor, at::Tensor> sentences(int64_t count, int64_t context, uint64_t seed) {
  auto table_gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor successors = at::randint(0, kVocab, {kVocab, 2}, table_gen);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor seq = at::empty({count, context + 1}, at::kLong);
  seq.select(1, 0).copy_(at::randint(0, kVocab, {count}, gen));
  const at::Tensor choice = at::randint(0, 2, {count, context}, gen);
  for (int64_t t = 0; t < context; ++t) {
    seq.select(1, t + 1).copy_(successors.index({seq.select(1, t), choice.select(1, t)}));
  }
  return {seq.slice(1, 0, context).contiguous(), seq.slice(1, 1).contiguous()};
}

// Megatron's plan; the head keeps its classes cut, for the parallel loss.
tandem::tp::Plan tensor_parallel_plan() {
  namespace tp = tandem::tp;
  return {{"tok_emb", tp::RowwiseParallel()},     {"blocks.*.[qkv]", tp::ColwiseParallel()},
          {"blocks.*.proj", tp::RowwiseParallel()}, {"blocks.*.fc1", tp::ColwiseParallel()},
          {"blocks.*.fc2", tp::RowwiseParallel()},  {"head", tp::ColwiseParallel()}};
}

// Cross entropy per token; under tensor parallelism over the logits' cut classes (`tp_group`).
at::Tensor token_loss(const at::Tensor& logits, const at::Tensor& next, at::Reduction::Reduction reduction,
                      const std::shared_ptr<tandem::comm::ProcessGroup>& tp_group) {
  if (tp_group) {
    at::Tensor loss = tandem::tp::cross_entropy(logits.to(at::kFloat), next, tp_group,
                                                tandem::tp::CrossEntropyOptions().reduction(reduction));
    return reduction == at::Reduction::None ? loss.reshape({-1}) : loss;
  }
  return at::cross_entropy_loss(logits.reshape({-1, kVocab}).to(at::kFloat), next.reshape({-1}), {}, reduction);
}

std::map<std::string, tandem::Strategy> kStrategies = {{"auto", tandem::Strategy::Auto},
                                                       {"single", tandem::Strategy::Single},
                                                       {"ddp", tandem::Strategy::Ddp},
                                                       {"fsdp", tandem::Strategy::Fsdp}};
std::map<std::string, tandem::PipelineSchedule> kSchedules = {{"gpipe", tandem::PipelineSchedule::GPipe},
                                                             {"1f1b", tandem::PipelineSchedule::OneFOneB},
                                                             {"interleaved", tandem::PipelineSchedule::Interleaved1F1B}};
std::map<std::string, tandem::Precision> kPrecisions = {
    {"no", tandem::Precision::No}, {"bf16", tandem::Precision::Bf16}, {"fp16", tandem::Precision::Fp16}};

int train(int argc, char** argv) {
  CLI::App app{"A small GPT with tandem::Accelerator, fully sharded"};
  int epochs = 2;
  int64_t layers = 4, dim = 128, heads = 4, context = 32, batch_size = 16, samples = 4096, checkpointing_steps = 0;
  std::string strategy = "fsdp", precision = "no", checkpoints = "checkpoints", resume_from;
  double dropout = 0.0;
  bool activation_checkpointing = false;
  int64_t checkpoint_every = 1;
  int tp_size = 1, pp_size = 1, microbatches = 0;
  std::string schedule = "1f1b";
  app.add_option("--epochs", epochs, "Passes over the training text")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--layers", layers, "Transformer blocks")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--dim", dim, "Model width (a multiple of --heads)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--heads", heads, "Attention heads")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--samples", samples, "Training sequences")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch-size", batch_size, "Sequences per process per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--strategy", strategy)->check(CLI::IsMember({"auto", "single", "ddp", "fsdp"}))->capture_default_str();
  app.add_option("--mixed-precision", precision)->check(CLI::IsMember({"no", "bf16", "fp16"}))->capture_default_str();
  app.add_option("--checkpoints", checkpoints, "Where the checkpoints go")->capture_default_str();
  app.add_option("--checkpointing-steps", checkpointing_steps, "Also save a checkpoint every N steps (0: at the end only)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--resume-from", resume_from, "A checkpoint folder (or a folder of them) to continue from");
  app.add_option("--dropout", dropout, "Dropout after attention and MLP")->check(CLI::Range(0.0, 0.9))->capture_default_str();
  app.add_flag("--activation-checkpointing", activation_checkpointing,
               "Recompute the blocks' forwards in backward instead of keeping their activations");
  app.add_option("--checkpoint-every", checkpoint_every, "With --activation-checkpointing: every N-th block only")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--tp", tp_size, "Tensor parallelism: processes each block is cut over")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--pp", pp_size, "Pipeline parallelism: processes the model's stages run on")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--schedule", schedule, "With --pp: the pipeline's schedule (interleaved: 2 stages per process)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}))->capture_default_str();
  app.add_option("--microbatches", microbatches, "With --pp: microbatches per step (0: 2 x --pp)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (dim % heads != 0) {
    std::fprintf(stderr, "tiny_gpt: --dim %lld is not a multiple of --heads %lld\n", static_cast<long long>(dim),
                 static_cast<long long>(heads));
    return 2;
  }
  if (heads % tp_size != 0) {
    std::fprintf(stderr, "tiny_gpt: --heads %lld is not divisible by --tp %d: each process takes whole heads\n",
                 static_cast<long long>(heads), tp_size);
    return 2;
  }

  const bool pipelined = pp_size > 1;
  const int64_t stages = pp_size * (schedule == "interleaved" ? 2 : 1);
  if (pipelined && layers < stages) {
    std::fprintf(stderr, "tiny_gpt: --layers %lld cannot fill %lld pipeline stages: each stage needs a block\n",
                 static_cast<long long>(layers), static_cast<long long>(stages));
    return 2;
  }
  auto options = tandem::AcceleratorOptions()
                     .strategy(kStrategies.at(strategy))
                     .mixed_precision(kPrecisions.at(precision))
                     .seed(42)
                     .parallelism(tandem::ParallelismConfig().tp_size(tp_size).pp_size(pp_size));
  if (activation_checkpointing) {
    options.activation_checkpointing(tandem::nn::CheckpointPolicy().every_n(checkpoint_every).module_types({"Block"}));
  }
  tandem::Accelerator acc(options);
  // Without --pp the whole model; with it, this process's stages of it (the same weights).
  std::optional<tandem::PreparedModel<Gpt>> model;
  std::optional<tandem::PreparedPipeline<GptStage>> pipe;
  std::vector<at::Tensor> parameters;
  if (pipelined) {
    Gpt whole(context, dim, layers, heads, dropout);
    std::vector<GptStage> mine;
    for (int s : acc.pipeline_stages(static_cast<int>(stages))) mine.push_back(GptStage(whole, s, stages, layers));
    auto loss = [](const at::Tensor& logits, const at::Tensor& next) {
      return token_loss(logits, next, at::Reduction::Mean, nullptr);
    };
    pipe.emplace(acc.prepare_pipeline(mine, loss,
                                      tandem::PipelineOptions().schedule(kSchedules.at(schedule)).microbatches(microbatches)));
    parameters = pipe->parameters();
  } else {
    model.emplace(acc.prepare_model(Gpt(context, dim, layers, heads, dropout), tensor_parallel_plan()));
    parameters = (*model)->parameters();
  }
  const auto tp_group = acc.tensor_parallel_group();
  torch::optim::AdamW optimizer(parameters, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  acc.prepare_optimizer(optimizer);
  auto [train_x, train_y] = sentences(samples, context, 1);
  auto [test_x, test_y] = sentences(512, context, 2);
  auto train_loader = acc.prepare_data(train_x, train_y, batch_size);
  auto test_loader = acc.prepare_data(test_x, test_y, 64, /*shuffle=*/false);
  acc.handle_stop_signals();  // SIGTERM / SIGINT: save and stop after the step (below)
  // --resume-from, or by itself when the job was started again (requeued by Slurm, restarted by
  // its launcher): the newest checkpoint under --checkpoints, if there is one.
  std::optional<std::string> resumed;
  if (!resume_from.empty()) {
    acc.load_state(resume_from);
    resumed = resume_from;
  } else if (acc.restarted()) {
    resumed = acc.load_state_if_any(checkpoints);
  }
  if (resumed) {
    acc.print("resumed from %s at step %lld (epoch %lld)\n", resumed->c_str(),
              static_cast<long long>(acc.completed_steps()), static_cast<long long>(train_loader.epoch()));
  }

  const int64_t total = epochs * train_loader.batches_per_epoch();
  auto bar = acc.progress_bar(total, "train");
  const auto start = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  auto train_mode = [&](bool on) {
    if (model) (*model)->train(on);
    if (pipe) {
      for (auto& stage : pipe->models()) stage->train(on);
    }
  };
  while (train_loader.epoch() < epochs) {
    train_mode(true);
    for (auto& batch : train_loader) {
      double loss = 0;
      if (pipe) {
        // The step's forward and backward in microbatches; the loss is known on the last stage.
        const auto losses = pipe->step(batch.data.to(acc.device()), batch.target.to(acc.device()));
        at::Tensor mean = at::zeros({1}, at::kDouble);
        if (pipe->is_last()) mean.fill_(at::stack(losses).mean().item<double>());
        acc.pipeline_group()->broadcast(mean, acc.pipeline_size() - 1);
        loss = mean.item<double>();
        acc.clip_grad_norm(parameters, 1.0);
      } else {
        auto sync = acc.accumulate(*model);
        at::Tensor batch_loss = token_loss((*model)->forward(batch.data.to(acc.device())), batch.target.to(acc.device()),
                                           at::Reduction::Mean, tp_group);
        acc.backward(batch_loss);
        if (acc.sync_gradients()) acc.clip_grad_norm(parameters, 1.0);
        loss = batch_loss.item<double>();
      }
      acc.step(optimizer);
      acc.zero_grad(optimizer);
      tokens += batch.data.numel() * acc.data_parallel_size();
      bar.update(acc.completed_steps(), batch.data.size(0) * acc.data_parallel_size(), loss);
      if (checkpointing_steps > 0 && acc.sync_gradients() && acc.completed_steps() % checkpointing_steps == 0) {
        acc.save_state(checkpoints);
      }
      // Preempted (Slurm), asked to make room (an elastic job's next round) or Ctrl-C: save the
      // step every process agrees on, and stop as the signal would have (Note [Stopping on a signal]).
      if (acc.sync_gradients() && acc.stop_requested()) {
        bar.finish();
        const std::string saved = acc.save_state(checkpoints);
        acc.print("stopped by signal %d after step %lld: checkpoint %s\n", acc.stop_signal(),
                  static_cast<long long>(acc.completed_steps()), saved.c_str());
        return 128 + acc.stop_signal();
      }
    }
  }
  bar.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Held-out loss over exactly the 512 test sequences, whatever the number of processes.
  train_mode(false);
  at::NoGradGuard no_grad;
  double loss_sum = 0;
  int64_t counted = 0;
  for (auto& batch : test_loader) {
    at::Tensor logits = pipe ? pipe->evaluate(batch.data.to(acc.device())) : (*model)->forward(batch.data.to(acc.device()));
    if (pipe && !pipe->is_last()) continue;  // the logits are the last stage's
    at::Tensor per_sequence = token_loss(logits, batch.target.to(acc.device()), at::Reduction::None, tp_group)
                                  .view({batch.data.size(0), -1})
                                  .sum(1);
    at::Tensor all = acc.gather_for_metrics(per_sequence);  // over the data-parallel ranks
    loss_sum += all.sum().item<double>();
    counted += all.size(0) * context;
  }
  if (pipe) {  // the last stage's first data-parallel process has the sums: to the main process
    at::Tensor sums = at::zeros({2}, at::kDouble);
    if (pipe->is_last() && acc.data_parallel_rank() == 0) {
      sums[0] = loss_sum;
      sums[1] = static_cast<double>(counted);
    }
    sums = acc.reduce(sums);
    loss_sum = sums[0].item<double>();
    counted = static_cast<int64_t>(sums[1].item<double>());
  }
  const std::string saved = acc.save_state(checkpoints);
  acc.print("held-out loss %.3f nats/token (the language's entropy: %.3f; guessing: %.3f), %.0f training tokens/s "
            "over %.1f s, checkpoint %s\n",
            loss_sum / counted, std::log(2.0), std::log(static_cast<double>(kVocab)), tokens / seconds, seconds,
            saved.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tiny_gpt: %s\n", tandem::one_line(e).c_str());
    return 1;
  }
}
