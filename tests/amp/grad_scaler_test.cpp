// GradScaler against PyTorch's own torch.amp.GradScaler (tests/oracles/grad_scaler.json, written
// by tests/oracles/make_grad_scaler_oracle.py with the pinned wheel): the same pattern of finite,
// inf and NaN gradients gives the same scales bit for bit, the same growth tracker, the same
// skipped steps and the same parameters. Then the rule's parts one by one, state round trips,
// and every misuse's message.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <nlohmann/json.hpp>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include "support/errors.h"
#include "tandem/amp/grad_scaler.h"

using tandem::amp::GradScaler;
using tandem::amp::GradScalerOptions;
using tandem::amp::GradScalerState;
using tandem::amp::OptState;

namespace {

const nlohmann::json& table() {
  static const nlohmann::json t = [] {
    std::ifstream in(TANDEM_ORACLES_DIR "/grad_scaler.json");
    if (!in) throw std::runtime_error("missing oracle file grad_scaler.json");
    return nlohmann::json::parse(in);
  }();
  return t;
}

// The oracle writes inf and NaN as strings (JSON has no such numbers).
at::Tensor decode(const nlohmann::json& values) {
  std::vector<float> out;
  for (const auto& v : values) {
    if (v.is_string()) {
      const auto s = v.get<std::string>();
      out.push_back(s == "nan" ? std::numeric_limits<float>::quiet_NaN()
                               : (s == "-inf" ? -1.0f : 1.0f) * std::numeric_limits<float>::infinity());
    } else {
      out.push_back(static_cast<float>(v.get<double>()));
    }
  }
  return at::tensor(out);
}

// SGD that counts the steps it was asked to take.
struct CountingSGD : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  at::Tensor step(LossClosure closure = nullptr) override {
    ++steps;
    return torch::optim::SGD::step(closure);
  }
  int steps = 0;
};

// The oracle's model: w and b, each with its own SGD.
struct Model {
  at::Tensor w, b;
  CountingSGD opt_w, opt_b;
  explicit Model(const nlohmann::json& m, const c10::Device& device = c10::kCPU)
      : w(decode(m.at("w0")).to(device).requires_grad_()),
        b(decode(m.at("b0")).to(device).requires_grad_()),
        opt_w({w}, torch::optim::SGDOptions(m.at("lr_w").get<double>()).momentum(m.at("momentum_w").get<double>())),
        opt_b({b}, torch::optim::SGDOptions(m.at("lr_b").get<double>())) {}
};

GradScalerOptions oracle_options() {
  const auto& o = table().at("options");
  return GradScalerOptions()
      .init_scale(o.at("init_scale").get<double>())
      .growth_factor(o.at("growth_factor").get<double>())
      .backoff_factor(o.at("backoff_factor").get<double>())
      .growth_interval(o.at("growth_interval").get<int64_t>());
}

// Steps [first, last) of the table, checked against it.
void replay(GradScaler& scaler, Model& m, size_t first, size_t last) {
  const auto& steps = table().at("steps");
  const double max_norm = table().at("model").at("max_norm").get<double>();
  for (size_t t = first; t < last; ++t) {
    const auto& s = steps.at(t);
    SCOPED_TRACE("step " + std::to_string(t) + " " + s.at("events").dump());
    EXPECT_EQ(scaler.get_scale(), s.at("scale_used").get<double>());
    m.opt_w.zero_grad();
    m.opt_b.zero_grad();
    const int steps_w = m.opt_w.steps, steps_b = m.opt_b.steps;
    const c10::Device device = m.w.device();
    at::Tensor loss = (m.w * decode(s.at("cw")).to(device)).sum() + (m.b * decode(s.at("cb")).to(device)).sum();
    scaler.scale(loss).backward();
    if (s.at("clip").get<bool>()) {
      scaler.unscale(m.opt_w);
      scaler.unscale(m.opt_b);
      torch::nn::utils::clip_grad_norm_({m.w, m.b}, max_norm);
    }
    const bool stepped_w = scaler.step(m.opt_w);
    const bool stepped_b = scaler.step(m.opt_b);
    scaler.update();
    EXPECT_EQ(stepped_w, s.at("stepped_w").get<bool>());
    EXPECT_EQ(stepped_b, s.at("stepped_b").get<bool>());
    EXPECT_EQ(m.opt_w.steps - steps_w, stepped_w ? 1 : 0);
    EXPECT_EQ(m.opt_b.steps - steps_b, stepped_b ? 1 : 0);
    EXPECT_EQ(scaler.get_scale(), s.at("scale").get<double>());  // bit for bit
    EXPECT_EQ(scaler.growth_tracker(), s.at("growth_tracker").get<int64_t>());
    EXPECT_LE((m.w.detach().cpu() - decode(s.at("w"))).abs().max().item<double>(), 1e-6);
    EXPECT_LE((m.b.detach().cpu() - decode(s.at("b"))).abs().max().item<double>(), 1e-6);
  }
}

// One iteration with gradient `g` (scaled by the scaler) on a single parameter.
bool iterate(GradScaler& scaler, at::Tensor& p, torch::optim::Optimizer& opt, float g) {
  opt.zero_grad();
  scaler.scale((p * g).sum()).backward();
  const bool stepped = scaler.step(opt);
  scaler.update();
  return stepped;
}

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

TEST(GradScaler, MatchesPyTorchOnTheOraclePattern) {
  ASSERT_GE(table().at("steps").size(), 30u);
  Model m(table().at("model"));
  GradScaler scaler(oracle_options());
  replay(scaler, m, 0, table().at("steps").size());
}

TEST(GradScaler, MatchesPyTorchOnTheOraclePatternOnCuda) {
  // The CUDA kernels of the same two ops: the same scales bit for bit (the table is the CPU one).
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device visible";
  Model m(table().at("model"), c10::Device(c10::kCUDA, 0));
  GradScaler scaler(oracle_options());
  replay(scaler, m, 0, table().at("steps").size());
}

TEST(GradScaler, DefaultsArePyTorchs) {
  const auto& d = table().at("defaults");
  const GradScalerState s = GradScaler().state_dict();
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.scale, d.at("scale").get<double>());
  EXPECT_EQ(s.growth_factor, d.at("growth_factor").get<double>());
  EXPECT_EQ(s.backoff_factor, d.at("backoff_factor").get<double>());
  EXPECT_EQ(s.growth_interval, d.at("growth_interval").get<int64_t>());
  EXPECT_EQ(s.growth_tracker, d.at("_growth_tracker").get<int64_t>());
  EXPECT_EQ(GradScaler().get_scale(), 65536.0);
}

TEST(GradScaler, GrowsAfterGrowthIntervalFiniteSteps) {
  at::Tensor p = at::ones({2}).requires_grad_();
  torch::optim::SGD opt({p}, 0.1);
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(3));
  for (int i = 1; i <= 2; ++i) {
    EXPECT_TRUE(iterate(scaler, p, opt, 1.0f));
    EXPECT_EQ(scaler.get_scale(), 8.0);
    EXPECT_EQ(scaler.growth_tracker(), i);
  }
  EXPECT_TRUE(iterate(scaler, p, opt, 1.0f));
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, BacksOffAndSkipsOnInfOrNan) {
  at::Tensor p = at::ones({2}).requires_grad_();
  CountingSGD opt({p}, torch::optim::SGDOptions(0.1));
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(3));
  EXPECT_TRUE(iterate(scaler, p, opt, 1.0f));
  EXPECT_EQ(scaler.growth_tracker(), 1);
  const at::Tensor before = p.detach().clone();
  for (float bad : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_FALSE(iterate(scaler, p, opt, bad));
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
  EXPECT_EQ(scaler.get_scale(), 1.0);  // 8 * 0.5^3
  EXPECT_EQ(opt.steps, 1);
  EXPECT_TRUE(at::equal(p.detach(), before));
}

TEST(GradScaler, GrowthStopsWhereTheScaleWouldOverflow) {
  at::Tensor p = at::ones({1}).requires_grad_();
  torch::optim::SGD opt({p}, 0.0);
  GradScaler scaler(GradScalerOptions().init_scale(std::ldexp(1.0, 127)).growth_interval(1));
  EXPECT_TRUE(iterate(scaler, p, opt, 0.0f));
  EXPECT_EQ(scaler.get_scale(), std::ldexp(1.0, 127));  // 2^128 is not a float32
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, StateRoundTripContinuesIdentically) {
  const size_t n = table().at("steps").size(), half = 11;  // after step 10: tracker 1 of 3
  Model m(table().at("model"));
  GradScaler first(oracle_options());
  replay(first, m, 0, half);
  const GradScalerState state = first.state_dict();
  EXPECT_EQ(state.scale, table().at("steps").at(half - 1).at("scale").get<double>());
  EXPECT_EQ(state.growth_tracker, 1);

  // A new scaler with other options: load_state_dict restores the factors too.
  GradScaler resumed(GradScalerOptions().growth_factor(4).backoff_factor(0.25).growth_interval(7));
  resumed.load_state_dict(state);
  EXPECT_EQ(resumed.get_scale(), state.scale);
  EXPECT_EQ(resumed.growth_tracker(), state.growth_tracker);
  replay(resumed, m, half, n);
}

TEST(GradScaler, ArchiveRoundTripContinuesIdentically) {
  const size_t n = table().at("steps").size(), half = 18;  // after step 17: tracker 2 of 3
  Model m(table().at("model"));
  GradScaler first(oracle_options());
  replay(first, m, 0, half);
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive out;
    first.save(out);
    out.save_to(bytes);
  }
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  GradScaler resumed;
  // Loaded after the first scale(): the existing scale tensor is overwritten in place.
  resumed.scale(at::ones({}));
  resumed.load(in);
  EXPECT_EQ(resumed.growth_tracker(), 2);
  EXPECT_EQ(resumed.get_scale(), table().at("steps").at(half - 1).at("scale").get<double>());
  replay(resumed, m, half, n);
}

TEST(GradScaler, ArchiveWithoutTheScalersEntriesIsRefused) {
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive out;
    out.write("something", c10::IValue(1.0));
    out.save_to(bytes);
  }
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  GradScaler scaler;
  EXPECT_ERROR(scaler.load(in),
               "GradScaler::load: the archive has no 'enabled' entry: expected one written by GradScaler::save");
}

TEST(GradScaler, UnscaleOnceThenClipThenStepWithAccumulation) {
  // accelerate #641: with accumulation and clipping under fp16 the gradients must be divided by
  // the scale exactly once. Two micro-batches accumulate scaled gradients; one unscale() before
  // clipping; step() sees the optimizer Unscaled and does not divide again.
  at::Tensor p = at::zeros({2}).requires_grad_();
  CountingSGD opt({p}, torch::optim::SGDOptions(1.0));
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  scaler.scale((p * at::tensor({1.0f, 2.0f})).sum()).backward();
  scaler.scale((p * at::tensor({3.0f, 4.0f})).sum()).backward();
  EXPECT_TRUE(at::equal(p.grad(), at::tensor({4096.0f, 6144.0f})));
  EXPECT_EQ(scaler.state_of(opt), OptState::Ready);
  scaler.unscale(opt);
  EXPECT_EQ(scaler.state_of(opt), OptState::Unscaled);
  EXPECT_TRUE(at::equal(p.grad(), at::tensor({4.0f, 6.0f})));
  EXPECT_ERROR(scaler.unscale(opt),
               "GradScaler::unscale: already called for this optimizer since the last update(): unscale once per "
               "iteration, after the last backward and before clipping (a second call would divide the gradients "
               "twice)");
  EXPECT_TRUE(at::equal(p.grad(), at::tensor({4.0f, 6.0f})));  // the refused call changed nothing
  torch::nn::utils::clip_grad_norm_({p}, 5.0);                  // norm 7.21 -> 5
  const at::Tensor clipped = p.grad().clone();
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_EQ(scaler.state_of(opt), OptState::Stepped);
  EXPECT_TRUE(at::equal(p.grad(), clipped));
  EXPECT_TRUE(at::allclose(p.detach(), -clipped));
  scaler.update();
  EXPECT_EQ(scaler.state_of(opt), OptState::Ready);
  EXPECT_EQ(opt.steps, 1);
}

TEST(GradScaler, MisuseIsAnErrorWithPyTorchsRules) {
  at::Tensor p = at::ones({2}).requires_grad_();
  torch::optim::SGD opt({p}, 0.1);
  GradScaler scaler;
  EXPECT_ERROR(scaler.unscale(opt),
               "GradScaler::unscale called before scale(): call scaler.scale(loss).backward() earlier in the "
               "iteration");
  EXPECT_ERROR(scaler.step(opt),
               "GradScaler::step called before scale(): call scaler.scale(loss).backward() earlier in the iteration");
  EXPECT_ERROR(scaler.update(),
               "GradScaler::update called before scale(): call scaler.scale(loss).backward() earlier in the "
               "iteration");
  scaler.scale((p * 2).sum()).backward();
  EXPECT_ERROR(scaler.update(),
               "GradScaler::update: no optimizer was unscaled or stepped since the last update(): call "
               "scaler.step(optimizer) before update()");
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_ERROR(scaler.step(opt),
               "GradScaler::step: already called for this optimizer since the last update(): call update() once "
               "per iteration, after step() for every optimizer");
  EXPECT_ERROR(scaler.unscale(opt),
               "GradScaler::unscale: called after step() for this optimizer: unscale before step(), or call "
               "update() to start the next iteration");
  scaler.update();

  torch::optim::SGD no_grads({at::ones({2}).requires_grad_()}, 0.1);
  EXPECT_ERROR(scaler.step(no_grads),
               "GradScaler::step: the optimizer has no gradients to check: call scaler.scale(loss).backward() "
               "before step()");
}

TEST(GradScaler, RefusesFloat16Gradients) {
  at::Tensor p = at::ones({2}, at::kHalf).requires_grad_();
  torch::optim::SGD opt({p}, 0.1);
  GradScaler scaler;
  p.mutable_grad() = at::ones({2}, at::kHalf);
  scaler.scale(at::ones({}));
  EXPECT_ERROR(scaler.unscale(opt),
               "GradScaler::unscale: a gradient is float16: attempting to unscale FP16 gradients; keep the "
               "parameters in float32 and let autocast run the ops in float16");
}

TEST(GradScaler, RefusesBadOptionsAndStates) {
  EXPECT_ERROR(GradScaler(GradScalerOptions().growth_factor(1.0)), "GradScaler: growth_factor 1 must be > 1.0");
  EXPECT_ERROR(GradScaler(GradScalerOptions().backoff_factor(1.5)), "GradScaler: backoff_factor 1.5 must be in (0, 1)");
  EXPECT_ERROR(GradScaler(GradScalerOptions().growth_interval(0)), "GradScaler: growth_interval 0 must be >= 1");
  EXPECT_ERROR(GradScaler(GradScalerOptions().init_scale(-1)), "GradScaler: init_scale -1 must be finite and > 0");
  GradScaler(GradScalerOptions().growth_factor(0.5).enabled(false));  // disabled: nothing to check, as PyTorch

  GradScaler scaler;
  GradScalerState disabled = GradScaler(GradScalerOptions().enabled(false)).state_dict();
  EXPECT_FALSE(disabled.enabled);
  EXPECT_ERROR(scaler.load_state_dict(disabled),
               "GradScaler::load_state_dict: the state was saved from a disabled GradScaler (PyTorch's empty "
               "state_dict): there is no scale to restore");
  GradScalerState bad;
  bad.growth_tracker = 2000;
  EXPECT_ERROR(scaler.load_state_dict(bad),
               "GradScaler::load_state_dict: _growth_tracker 2000 must be in [0, growth_interval 2000)");
  bad = {};
  bad.scale = std::numeric_limits<double>::infinity();
  EXPECT_ERROR(scaler.load_state_dict(bad), "GradScaler::load_state_dict: scale inf must be finite and > 0");
  EXPECT_EQ(scaler.get_scale(), 65536.0);  // refused states change nothing
}

TEST(GradScaler, DisabledIsATransparentPassThrough) {
  at::Tensor p = at::ones({2}).requires_grad_();
  CountingSGD opt({p}, torch::optim::SGDOptions(0.5));
  GradScaler scaler(GradScalerOptions().enabled(false));
  at::Tensor loss = (p * kInf).sum();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  scaler.unscale(opt);
  EXPECT_TRUE(scaler.step(opt));  // no check: the step runs
  scaler.update();
  EXPECT_EQ(opt.steps, 1);
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, UpdateWithANewScale) {
  at::Tensor p = at::ones({2}).requires_grad_();
  torch::optim::SGD opt({p}, 0.1);
  GradScaler scaler(GradScalerOptions().growth_interval(10));
  EXPECT_TRUE(iterate(scaler, p, opt, 1.0f));
  scaler.scale((p * 1.0f).sum()).backward();
  scaler.step(opt);
  scaler.update(128.0);
  EXPECT_EQ(scaler.get_scale(), 128.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);  // kept, as PyTorch keeps it
  EXPECT_EQ(scaler.state_of(opt), OptState::Ready);
}

TEST(GradScaler, ScalesTheLossOnItsOwnDeviceAndDtype) {
  GradScaler scaler(GradScalerOptions().init_scale(4));
  EXPECT_EQ(scaler.scale(at::full({}, 1.5)).item<double>(), 6.0);
  // PyTorch's type promotion, as in Python: a 0-dim bf16 loss times the 0-dim float32 scale is
  // float32; a loss with dimensions keeps its dtype.
  EXPECT_EQ(scaler.scale(at::full({}, 1.5, at::kBFloat16)).scalar_type(), at::kFloat);
  const at::Tensor bf16 = scaler.scale(at::full({2}, 1.5, at::kBFloat16));
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(bf16, at::full({2}, 6.0, at::kBFloat16)));
}
