// Fashion-MNIST with the Accelerator, top to bottom: the same program trains on one CPU, on
// several processes (`tandem run`, torchrun, mpirun), on one GPU or several.
//
//   tandem run --nproc-per-node 2 -- ./fashion_mnist [--epochs 8] [--strategy auto|single|dp|ddp|fsdp]
//       [--mixed-precision no|bf16|fp16] [--zero-stage 0|1|2] [--batch-size 64] [--checkpoints DIR]
//       [--checkpointing-steps N] [--resume-from DIR]
//
// It prints the test accuracy and the throughput at the end, and leaves a checkpoint. A checkpoint
// resumes under any number of processes: the rest of its epoch is shared among them. A job started
// again (requeued by Slurm, restarted by its launcher) resumes from the newest checkpoint under
// --checkpoints by itself. SIGTERM or Ctrl-C saves a checkpoint after the current step and ends
// the program with 128 + the signal (Slurm's preemption, an elastic job's next round).
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include "tandem/accelerate/accelerator.h"
#include "tandem/data/fashion_mnist.h"

namespace {

// Two convolutions and two linear layers: about 0.2 M parameters. Each layer is a
// tandem::fsdp::Unit: under --strategy fsdp it is gathered just before it runs and freed after;
// under the other strategies a Unit only calls the layer.
struct CnnImpl : torch::nn::Module {
  using Unit = tandem::fsdp::Unit;
  CnnImpl()
      : conv1(register_module("conv1", Unit(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1))))),
        conv2(register_module("conv2", Unit(torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1))))),
        fc1(register_module("fc1", Unit(torch::nn::Linear(32 * 7 * 7, 128)))),
        fc2(register_module("fc2", Unit(torch::nn::Linear(128, 10)))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::max_pool2d(conv1(x).relu(), 2);  // 16 x 14 x 14
    h = at::max_pool2d(conv2(h).relu(), 2);             // 32 x 7 x 7
    return fc2(fc1(h.flatten(1)).relu());
  }
  Unit conv1, conv2, fc1, fc2;
};
TORCH_MODULE(Cnn);

std::map<std::string, tandem::Strategy> kStrategies = {{"auto", tandem::Strategy::Auto},
                                                       {"single", tandem::Strategy::Single},
                                                       {"dp", tandem::Strategy::DataParallel},
                                                       {"ddp", tandem::Strategy::Ddp},
                                                       {"fsdp", tandem::Strategy::Fsdp}};
std::map<std::string, tandem::Precision> kPrecisions = {
    {"no", tandem::Precision::No}, {"bf16", tandem::Precision::Bf16}, {"fp16", tandem::Precision::Fp16}};

int train(int argc, char** argv) {
  CLI::App app{"Fashion-MNIST with tandem::Accelerator"};
  int epochs = 8, zero_stage = 0;
  int64_t batch_size = 64, checkpointing_steps = 0;
  std::string strategy = "auto", precision = "no", checkpoints = "checkpoints", resume_from, data_root;
  app.add_option("--epochs", epochs, "Passes over the training set")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch-size", batch_size, "Samples per process per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--strategy", strategy)->check(CLI::IsMember({"auto", "single", "dp", "ddp", "fsdp"}))->capture_default_str();
  app.add_option("--mixed-precision", precision)->check(CLI::IsMember({"no", "bf16", "fp16"}))->capture_default_str();
  app.add_option("--zero-stage", zero_stage,
                 "0: plain DDP; 1: each process keeps its share of Adam's state; 2: and of the gradients")
      ->check(CLI::IsMember({0, 1, 2}))->capture_default_str();
  app.add_option("--checkpoints", checkpoints, "Where the checkpoints go")->capture_default_str();
  app.add_option("--checkpointing-steps", checkpointing_steps, "Also save a checkpoint every N steps (0: at the end only)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--resume-from", resume_from, "A checkpoint folder (or a folder of them) to continue from");
  app.add_option("--data", data_root, "Fashion-MNIST folder (default: Debian's dataset-fashion-mnist)");
  CLI11_PARSE(app, argc, argv);

  tandem::Accelerator acc(tandem::AcceleratorOptions()
                              .strategy(kStrategies.at(strategy))
                              .mixed_precision(kPrecisions.at(precision))
                              .zero_stage(zero_stage)
                              .seed(42));
  auto options = tandem::data::FashionMnistOptions();
  if (!data_root.empty()) options.root(data_root);
  tandem::data::FashionMnist train_set(options), test_set(options.split(tandem::data::Split::Test));

  auto model = acc.prepare_model(Cnn());
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  acc.prepare_optimizer(optimizer);
  auto train_loader = acc.prepare_data(train_set.images(), train_set.targets(), batch_size);
  auto test_loader = acc.prepare_data(test_set.images(), test_set.targets(), 256, /*shuffle=*/false);
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

  // Training: the loop is the same whatever was launched.
  const int64_t total = epochs * train_loader.batches_per_epoch();
  auto bar = acc.progress_bar(total, "train");
  const auto start = std::chrono::steady_clock::now();
  int64_t samples = 0;
  while (train_loader.epoch() < epochs) {
    model->train();
    for (auto& batch : train_loader) {
      auto sync = acc.accumulate(model);
      at::Tensor loss = at::cross_entropy_loss(model->forward(batch.data.to(acc.device())), batch.target.to(acc.device()));
      acc.backward(loss);
      acc.step(optimizer);
      acc.zero_grad(optimizer);
      samples += batch.data.size(0) * acc.num_processes();
      bar.update(acc.completed_steps(), batch.data.size(0) * acc.num_processes(), loss.item<double>());
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

  // Evaluation over exactly the 10,000 test images, whatever the number of processes.
  model->eval();
  at::NoGradGuard no_grad;
  int64_t correct = 0, seen = 0;
  for (auto& batch : test_loader) {
    at::Tensor right = model->forward(batch.data.to(acc.device())).argmax(1).eq(batch.target.to(acc.device()));
    at::Tensor all = acc.gather_for_metrics(right);
    correct += all.sum().item<int64_t>();
    seen += all.size(0);
  }
  const std::string saved = acc.save_state(checkpoints);
  acc.print("test accuracy %.2f%% (%lld/%lld images), %.0f training samples/s over %.1f s, checkpoint %s\n",
            100.0 * correct / seen, static_cast<long long>(correct), static_cast<long long>(seen),
            samples / seconds, seconds, saved.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", tandem::one_line(e).c_str());
    return 1;
  }
}
