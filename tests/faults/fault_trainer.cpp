// The program the restart, checkpoint and rendezvous fault tests run (tests/faults/*.sh): a small
// Accelerator training job on synthetic data that checkpoints every k steps and resumes from the
// newest checkpoint on start, with deterministic fault injections.
//
//   fault_trainer train --root DIR --out DIR --steps N --every K [faults]
//       2 ranks (or any number) under `tandem run`. Resumes with load_state_if_any(DIR), trains
//       to N optimizer steps, save_state(DIR) every K steps. Writes to OUT, per attempt a and rank r:
//       pid.a<a>.r<r>, and trace.a<a>.r<r> with lines `fresh` or `resumed <step> <path>`,
//       `step <n> <hex bits of every weight>` after each step, `saved <step> <path>`, `final <bits>`.
//     faults (attempt 0 only, i.e. TORCHELASTIC_RESTART_COUNT=0):
//       --kill-rank R --kill-step S   rank R raises SIGKILL during step S (after its forward, before
//                                     its backward, while the others wait in the gradient all-reduce)
//       --kill-in-save S              the main process raises SIGKILL inside save_state of step S,
//                                     after the weights, optimizer and RNG files are written to the
//                                     temporary folder and before the manifest and the rename
//     SIGTERM: --save-on-sigterm      SIGTERM sets a flag; the ranks agree on it after every step
//                                     (a max all-reduce) and then save_state and exit 0
//              --wait-for-sigterm-at S  every rank waits after step S until SIGTERM comes (60 s)
//              --linger-rank R        after that save, rank R ignores SIGTERM and sleeps (a worker
//                                     that does not exit: the launcher must SIGKILL it)
//     Timestamps (CLOCK_REALTIME, ns) go to OUT: killed_at, start.a<a>.r<r>, resumed.a<a>.r<r>,
//     sigterm_saved.r<r>.
//     elastic runs (tests/faults/elastic_test.sh):
//       --epochs E                    train E whole epochs instead of --steps (the number of steps
//                                     depends on the world size)
//       --sample-log                  after each step, a line `samples <step> <epoch> <ids>` with
//                                     the dataset rows of this rank's batch (found by value)
//       --step-delay-ms D             sleep D ms after each step (time for a test to act mid-epoch)
//       --seed S                      the Accelerator's seed (default 7)
//       --hidden H                    the hidden layer's width (default 32): another model
//     At the end a line `loss <value>`: the cross-entropy of the whole dataset, dropout off.
//   fault_trainer inspect --root DIR
//       One process, no Accelerator: prints `listed <names>` (list_checkpoints), then verifies the
//       newest with CheckpointReader and prints `step <n> <bits>` of its weights (state.json's step).
//   fault_trainer hold --dir DIR
//       Joins the job's process group, writes DIR/ready.r<r> (`<pid> <MASTER_PORT>`), waits until
//       DIR/release exists (60 s), then a barrier, exit 0.
// Every error is one line on stderr and exit code 2.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <nlohmann/json.hpp>

#include "tandem/accelerate/accelerator.h"
#include "tandem/accelerate/checkpoint_dir.h"
#include "tandem/accelerate/safetensors.h"
#include "tandem/error.h"

using namespace tandem;

namespace {

// The weights, in the order every trace line prints them.
const std::vector<std::string> kWeights = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  explicit NetImpl(int64_t hidden = 32) : hidden(hidden) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    drop = register_module("drop", torch::nn::Dropout(0.25));  // draws from the RNG every step
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 4));
  }
  int64_t hidden;
  at::Tensor forward(const at::Tensor& x) { return fc2(drop(fc1(x).tanh())); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Net);

volatile sig_atomic_t g_sigterm = 0;
void on_sigterm(int) { g_sigterm = 1; }

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void write_file(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path + ".part");
    out << text;
    TANDEM_CHECK(out.good(), "cannot write ", path);
  }
  TANDEM_CHECK(std::rename((path + ".part").c_str(), path.c_str()) == 0, "cannot write ", path);  // never half a file
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

/// `--key value` pairs; every key must be one the mode knows.
std::map<std::string, std::string> parse(int argc, char** argv, const std::vector<std::string>& known) {
  std::map<std::string, std::string> args;
  for (int i = 2; i < argc; ++i) {
    const std::string key = argv[i];
    TANDEM_CHECK(key.rfind("--", 0) == 0 && std::find(known.begin(), known.end(), key.substr(2)) != known.end(),
                 "unknown argument '", key, "' for mode ", argv[1]);
    const bool flag = key == "--save-on-sigterm" || key == "--sample-log";
    TANDEM_CHECK(flag || i + 1 < argc, key, " needs a value");
    args[key.substr(2)] = flag ? "1" : argv[++i];
  }
  return args;
}

int64_t number(const std::map<std::string, std::string>& args, const std::string& key, int64_t fallback) {
  auto it = args.find(key);
  if (it == args.end()) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  TANDEM_CHECK(!it->second.empty() && *end == '\0' && v >= 0, "--", key, " '", it->second,
               "' is not a non-negative integer");
  return v;
}

std::string required(const std::map<std::string, std::string>& args, const std::string& key) {
  auto it = args.find(key);
  TANDEM_CHECK(it != args.end() && !it->second.empty(), "--", key, " is required");
  return it->second;
}

/// Every weight's float32 bits in hex: equal lines mean bit-identical weights.
std::string bits(const std::map<std::string, at::Tensor>& weights) {
  std::ostringstream line;
  for (const auto& name : kWeights) {
    auto it = weights.find(name);
    TANDEM_CHECK(it != weights.end(), "no weight ", name);
    at::Tensor flat = it->second.detach().to(at::kCPU).contiguous().reshape({-1});
    TANDEM_CHECK(flat.scalar_type() == at::kFloat, name, " is not float32");
    const auto* words = reinterpret_cast<const uint32_t*>(flat.data_ptr<float>());
    char hex[16];
    for (int64_t i = 0; i < flat.numel(); ++i) {
      std::snprintf(hex, sizeof hex, " %08x", words[i]);
      line << hex;
    }
  }
  return line.str();
}

std::string bits(Net& net) {
  std::map<std::string, at::Tensor> weights;
  for (const auto& item : net->named_parameters(true)) weights[item.key()] = item.value();
  return bits(weights);
}

int train(const std::map<std::string, std::string>& args) {
  const std::string root = required(args, "root"), out = required(args, "out");
  const int64_t epochs = number(args, "epochs", 0), every = number(args, "every", 0);
  const int64_t steps = number(args, "steps", epochs > 0 ? std::numeric_limits<int64_t>::max() : 0);
  TANDEM_CHECK(steps > 0 && every > 0, "--steps (or --epochs) and --every must be positive");
  const bool sample_log = args.count("sample-log") > 0;
  const int64_t step_delay_ms = number(args, "step-delay-ms", 0), seed = number(args, "seed", 7);
  const int64_t kill_rank = number(args, "kill-rank", -1), kill_step = number(args, "kill-step", -1);
  const int64_t kill_in_save = number(args, "kill-in-save", -1);
  const int64_t wait_at = number(args, "wait-for-sigterm-at", -1), linger_rank = number(args, "linger-rank", -1);
  const bool save_on_sigterm = args.count("save-on-sigterm") > 0;
  const int attempt = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  const int64_t started = now_ns();
  if (save_on_sigterm) ::signal(SIGTERM, on_sigterm);

  Accelerator acc(AcceleratorOptions().seed(static_cast<uint64_t>(seed)).progress(false).collective_timeout(std::chrono::seconds(60)));
  const int rank = acc.process_index();
  const std::string tag = ".a" + std::to_string(attempt) + ".r" + std::to_string(rank);
  write_file(out + "/pid" + tag, std::to_string(::getpid()));
  write_file(out + "/start" + tag, std::to_string(started));
  std::ofstream trace(out + "/trace" + tag);
  TANDEM_CHECK(trace.good(), "cannot write ", out, "/trace", tag);
  auto line = [&](const std::string& text) { trace << text << "\n" << std::flush; };

  Net net(number(args, "hidden", 32));
  auto model = acc.prepare_model(net);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  acc.prepare_optimizer(opt);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);  // the same data in every process and attempt
  at::Tensor x = at::randn({96, 8}, gen), y = at::randint(0, 4, {96}, gen);
  auto loader = acc.prepare_data(x, y, /*batch_size=*/8);  // 6 batches a rank and epoch at 2 ranks
  // A row's index from its first value (96 random floats: distinct).
  std::map<float, int64_t> row_of;
  for (int64_t i = 0; i < x.size(0); ++i) row_of[x[i][0].item<float>()] = i;
  // The save_state fault: user code that runs inside save_state, while the files are being written.
  acc.register_for_checkpointing(
      "fault-marker",
      [&]() {
        if (attempt == 0 && acc.completed_steps() == kill_in_save) {
          write_file(out + "/killed_at", std::to_string(now_ns()));
          ::raise(SIGKILL);
        }
        return std::string("marker");
      },
      [](const std::string&) {});

  // Auto-resume: the newest committed checkpoint, if any.
  if (auto resumed = acc.load_state_if_any(root)) {
    line("resumed " + std::to_string(acc.completed_steps()) + " " + *resumed);
  } else {
    line("fresh");
  }
  write_file(out + "/resumed" + tag, std::to_string(now_ns()));

  while (acc.completed_steps() < steps && (epochs == 0 || loader.epoch() < epochs)) {
    for (auto& batch : loader) {
      const int64_t step = acc.completed_steps() + 1;
      auto sync = acc.accumulate(model);
      auto loss = at::cross_entropy_loss(model->forward(batch.data), batch.target);
      if (attempt == 0 && rank == kill_rank && step == kill_step) {
        write_file(out + "/killed_at", std::to_string(now_ns()));
        ::raise(SIGKILL);  // the kernel kills it exactly as `kill -9` would
      }
      acc.backward(loss);
      acc.step(opt);
      acc.zero_grad(opt);
      line("step " + std::to_string(step) + bits(net));
      if (sample_log) {
        std::string ids = "samples " + std::to_string(step) + " " + std::to_string(loader.epoch());
        for (int64_t i = 0; i < batch.data.size(0); ++i) ids += " " + std::to_string(row_of.at(batch.data[i][0].item<float>()));
        line(ids);
      }
      if (step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
      if (step % every == 0) line("saved " + std::to_string(step) + " " + acc.save_state(root));
      if (step == wait_at) {
        write_file(out + "/waiting.r" + std::to_string(rank), std::to_string(::getpid()));
        for (int i = 0; i < 6000 && !g_sigterm; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        TANDEM_CHECK(g_sigterm, "no SIGTERM came within 60 s of step ", step);
      }
      if (save_on_sigterm) {
        // Signals reach the ranks at different moments: they stop together, after the same step.
        at::Tensor stop = acc.reduce(at::full({1}, g_sigterm ? 1 : 0, at::kInt), comm::ReduceOp::Max);
        if (stop.item<int>() != 0) {
          line("saved-on-sigterm " + std::to_string(step) + " " + acc.save_state(root));
          write_file(out + "/sigterm_saved.r" + std::to_string(rank), std::to_string(now_ns()));
          if (rank == linger_rank) {
            ::signal(SIGTERM, SIG_IGN);
            write_file(out + "/lingering.r" + std::to_string(rank), std::to_string(::getpid()));
            std::this_thread::sleep_for(std::chrono::seconds(120));
            return 4;
          }
          return 0;
        }
      }
      if (acc.completed_steps() == steps) break;
    }
  }
  line("final" + bits(net));
  net->eval();
  {
    at::NoGradGuard no_grad;
    char loss[64];
    std::snprintf(loss, sizeof loss, "loss %.6f", at::cross_entropy_loss(net->forward(x), y).item<double>());
    line(loss);
  }
  return 0;
}

int inspect(const std::map<std::string, std::string>& args) {
  const std::string root = required(args, "root");
  const auto found = accelerate::list_checkpoints(root);
  std::string listed = "listed";
  for (const auto& path : found) listed += " " + path.substr(path.rfind('/') + 1);
  std::printf("%s\n", listed.c_str());
  TANDEM_CHECK(!found.empty(), "inspect: no checkpoint under ", root);
  accelerate::CheckpointReader reader(found.back());  // verifies every file's size and CRC-32
  const auto state = nlohmann::json::parse(reader.read("state.json"));
  auto saved = accelerate::load_safetensors(reader.path("model_0.safetensors"));
  std::map<std::string, at::Tensor> weights(saved.tensors.begin(), saved.tensors.end());
  std::printf("step %lld%s\n", static_cast<long long>(state.at("completed_steps").get<int64_t>()), bits(weights).c_str());
  return 0;
}

int hold(const std::map<std::string, std::string>& args) {
  const std::string dir = required(args, "dir");
  auto world = comm::World::from_env();
  auto pg = comm::ProcessGroup::create(world, comm::ProcessGroupOptions()
                                                  .timeout(std::chrono::seconds(60))
                                                  .rendezvous_timeout(std::chrono::seconds(60)));
  write_file(dir + "/ready.r" + std::to_string(world.rank),
             std::to_string(::getpid()) + " " + std::to_string(world.master_port));
  for (int i = 0; i < 6000 && !exists(dir + "/release"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  TANDEM_CHECK(exists(dir + "/release"), "hold: ", dir, "/release did not appear within 60 s");
  pg->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    at::set_num_threads(1);  // ranks share two cores
    if (mode == "train") {
      return train(parse(argc, argv, {"root", "out", "steps", "every", "kill-rank", "kill-step", "kill-in-save",
                                      "save-on-sigterm", "wait-for-sigterm-at", "linger-rank", "epochs", "sample-log",
                                      "step-delay-ms", "seed", "hidden"}));
    }
    if (mode == "inspect") return inspect(parse(argc, argv, {"root"}));
    if (mode == "hold") return hold(parse(argc, argv, {"dir"}));
    throw Error("usage: fault_trainer train|inspect|hold --key value ... (see the comment atop fault_trainer.cpp)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fault_trainer: rank %s: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "0",
                 one_line(e).c_str());
    return 2;
  }
}
