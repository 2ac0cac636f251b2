// The plan reported is the plan built. Part of accelerator_test (worlds of 1, 2 and 4). For every ParallelismConfig
// x strategy x zero stage the Accelerator accepts at this world size (1, 2 and 4 processes), the
// prepared model's layouts (Accelerator::layouts) are the ones the reported plan says, and what
// each process holds of each tensor is exactly its box of the whole tensor; the groups the
// strategies use are the mesh's, row-major. Every other configuration is refused at construction,
// in one line, before anything is prepared.
//
// The expectations come from the documented rule (Note [Parallelism plan], Note [Layouts]), and
// the held data from the model built whole on every process: neither reads the library's layout
// code.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include "support/distributed_main.h"
#include "support/errors.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/comm/placement.h"
#include "tandem/nn/hookable.h"
#include "tandem/tp/style.h"

using namespace tandem;
using comm::Placement;

namespace tandem::comm {
void PrintTo(const Placement& p, std::ostream* os) { *os << p.str(); }
}  // namespace tandem::comm

namespace {

constexpr int64_t kIn = 6, kHidden = 8, kOut = 6;

// Sizes that leave FSDP uneven and empty pieces at 4 shards (down's 6 rows over 4: 2, 2, 2, 0),
// a 0-d parameter (one row under FSDP) and a buffer.
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : up(register_module("up", nn::Hookable(torch::nn::Linear(kIn, kHidden)))),
        down(register_module("down", nn::Hookable(torch::nn::Linear(kHidden, kOut)))) {
    gain = register_parameter("gain", at::ones({}));
    register_buffer("scale", at::full({2}, 0.5));
  }
  at::Tensor forward(const at::Tensor& x) { return down(at::relu(up(x))) * gain; }
  nn::Hookable up, down;
  at::Tensor gain;
};
TORCH_MODULE(Mlp);

const tp::Plan kPlan{{"up", tp::ColwiseParallel()}, {"down", tp::RowwiseParallel()}};

// The placement tensor parallelism gives each tensor of Mlp (its documented styles).
Placement tp_placement(const std::string& name) {
  static const std::map<std::string, Placement> cut{
      {"up.weight", Placement::shard(0)}, {"up.bias", Placement::shard(0)}, {"down.weight", Placement::shard(1)}};
  auto it = cut.find(name);
  return it == cut.end() ? Placement::replicate() : it->second;
}

struct Config {
  Strategy strategy;
  int replicate, shard, tp, pp, zero;
  std::string str() const {
    return std::string(to_string(strategy)) + " replicate " + std::to_string(replicate) + " shard " +
           std::to_string(shard) + " tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " zero " +
           std::to_string(zero);
  }
};

AcceleratorOptions options_of(const Config& c) {
  return AcceleratorOptions()
      .strategy(c.strategy)
      .zero_stage(c.zero)
      .progress(false)
      .parallelism(ParallelismConfig().replicate_size(c.replicate).shard_size(c.shard).tp_size(c.tp).pp_size(c.pp));
}

std::vector<int> ranks_where(int world, const std::function<bool(int)>& same) {
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) {
    if (same(r)) ranks.push_back(r);
  }
  return ranks;
}

// Checks one accepted configuration; returns how many tensors it checked.
int check_layouts(const Config& c) {
  Accelerator acc(test::shared_pg(), options_of(c));
  const ParallelismPlan& plan = acc.parallelism();  // what it reports
  const int world = test::pg().size(), rank = test::pg().rank();
  const int R = plan.replicate, S = plan.shard, T = plan.tp, P = plan.pp;
  EXPECT_EQ(R * S * T * P, world) << c.str();
  // Row-major ("pp", "replicate", "shard", "tp") coordinates of a rank.
  auto coord = [&](int r) { return std::vector<int>{r / (R * S * T), (r / (S * T)) % R, (r / T) % S, r % T}; };
  const auto mine = coord(rank);
  auto group_of = [&](int dim) {  // the ranks that differ from this one along `dim` only
    return ranks_where(world, [&](int r) {
      const auto other = coord(r);
      for (int d = 0; d < 4; ++d) {
        if (d != dim && other[d] != mine[d]) return false;
      }
      return true;
    });
  };
  if (T > 1) {
    EXPECT_EQ(acc.tensor_parallel_group()->global_ranks(), group_of(3)) << c.str();
  }
  EXPECT_EQ(acc.pipeline_group()->global_ranks(), group_of(0)) << c.str();
  if (acc.device_mesh() && R > 1) {
    EXPECT_EQ(acc.device_mesh()->group("replicate")->global_ranks(), group_of(1)) << c.str();
  }
  if (acc.device_mesh() && S > 1) {
    EXPECT_EQ(acc.device_mesh()->group("shard")->global_ranks(), group_of(2)) << c.str();
  }
  EXPECT_EQ(acc.data_parallel_size(), R * S) << c.str();
  EXPECT_EQ(acc.data_parallel_rank(), mine[1] * S + mine[2]) << c.str();
  EXPECT_EQ(acc.pipeline_rank(), mine[0]) << c.str();

  // The whole model, the same on every process.
  torch::manual_seed(11);
  Mlp mlp;
  std::map<std::string, at::Tensor> whole;
  for (const auto& item : mlp->named_parameters(true)) whole[item.key()] = item.value().detach().clone();
  for (const auto& item : mlp->named_buffers(true)) whole[item.key()] = item.value().detach().clone();

  std::vector<LaidOutTensor> laid_out;
  std::optional<PreparedModel<Mlp>> prepared;  // outside a pipeline
  if (P > 1) {
    auto pipeline = acc.prepare_pipeline(std::vector<Mlp>{mlp}, [](const at::Tensor& y, const at::Tensor& t) {
      return (y - t).pow(2).mean();
    });
    laid_out = acc.layouts(pipeline.models().front());
  } else {
    prepared = T > 1 ? acc.prepare_model(mlp, kPlan) : acc.prepare_model(mlp);
    laid_out = acc.layouts(*prepared);
  }
  EXPECT_EQ(laid_out.size(), whole.size()) << c.str();
  const bool fsdp = plan.strategy == Strategy::Fsdp;
  int checked = 0;
  for (const auto& t : laid_out) {
    const std::string what = c.str() + ": " + t.name + " " + t.layout.str();
    if (!whole.count(t.name)) {
      ADD_FAILURE() << what << ": no such tensor in the model";
      continue;
    }
    const comm::Layout& l = t.layout;
    EXPECT_EQ(l.mesh_shape, (std::vector<int64_t>{R, S, T})) << what;
    EXPECT_EQ(l.coordinate, (std::vector<int64_t>{mine[1], mine[2], mine[3]})) << what;
    const bool buffer = t.name == "scale";
    const Placement along_tp = buffer || T == 1 ? Placement::replicate() : tp_placement(t.name);
    Placement along_shard = Placement::replicate();
    if (fsdp && !buffer) {
      along_shard = along_tp.is_shard() && along_tp.dim == 0 ? Placement::strided_shard(0, T) : Placement::shard(0);
    }
    EXPECT_EQ(l.placements, (std::vector<Placement>{Placement::replicate(), along_shard, along_tp})) << what;
    const at::Tensor& w = whole[t.name];
    EXPECT_EQ(l.shape, w.sizes().vec()) << what;
    // What this process holds is its box of the whole tensor (a 0-d tensor is one row).
    const at::Tensor rows = w.dim() == 0 ? w.reshape({1}) : w;
    const at::Tensor box = comm::narrow_to(rows, l.chunk);
    const at::Tensor local = t.local.dim() == 0 ? t.local.reshape({1}) : t.local;
    EXPECT_EQ(local.sizes(), box.sizes()) << what;
    if (local.sizes() == box.sizes()) {
      EXPECT_TRUE(at::equal(local.to(at::kFloat), box)) << what;
    }
    ++checked;
  }
  if (prepared) {
    // The whole tensors again, from the boxes: on the main process, then on every process. (A
    // pipeline's are pipeline_test's: there every stage names its tensors apart.)
    for (bool everywhere : {false, true}) {
      const auto state = acc.get_state_dict(*prepared, everywhere);
      if (!everywhere && rank != 0) {
        EXPECT_TRUE(state.empty()) << c.str();
        continue;
      }
      EXPECT_EQ(state.size(), whole.size()) << c.str();
      for (const auto& [name, t] : state) {
        EXPECT_TRUE(whole.count(name) && t.sizes() == whole[name].sizes() && at::equal(t.to(at::kFloat), whole[name]))
            << c.str() << ": get_state_dict's " << name << (everywhere ? " on every process" : "");
      }
    }
  }
  return checked;
}

}  // namespace

TEST(LayoutPlan, EveryAcceptedConfigurationLaysTheProcessesOutAsItSays) {
  const int world = test::pg().size();
  int accepted = 0, refused = 0, tensors = 0;
  std::map<std::string, int> refusals;  // first words of each message, to see them in the log
  for (Strategy strategy : {Strategy::Auto, Strategy::Single, Strategy::DataParallel, Strategy::Ddp, Strategy::Fsdp}) {
    for (int replicate : {0, 1, 2, 4}) {
      for (int shard : {0, 1, 2, 4}) {
        for (int tp : {1, 2, 4}) {
          for (int pp : {1, 2, 4}) {
            for (int zero : {0, 1, 2}) {
              const Config c{strategy, replicate, shard, tp, pp, zero};
              std::optional<std::string> refusal;
              try {
                // Construction alone: it must refuse here, or not at all (no collective before
                // a refusal, so every rank refuses alike).
                Accelerator probe(test::shared_pg(), options_of(c));
              } catch (const Error& e) {
                refusal = e.what();
              }
              if (refusal) {
                ++refused;
                EXPECT_EQ(refusal->find('\n'), std::string::npos) << c.str() << ": " << *refusal;
                ++refusals[refusal->substr(0, refusal->find(':'))];
                continue;
              }
              ++accepted;
              tensors += check_layouts(c);
            }
          }
        }
      }
    }
  }
  std::printf("[layout plan] world %d: %d configurations accepted (%d tensors checked), %d refused\n", world, accepted,
              tensors, refused);
  for (const auto& [first, n] : refusals) std::printf("[layout plan]   refused by %s: %d\n", first.c_str(), n);
  EXPECT_GT(accepted, 0);
}


TEST(LayoutPlan, AModelAnotherAcceleratorPreparedIsAOneLineError) {
  Accelerator mine(test::shared_pg(), AcceleratorOptions().progress(false));
  Accelerator other(test::shared_pg(), AcceleratorOptions().progress(false));
  auto model = other.prepare_model(Mlp());
  EXPECT_ERROR(mine.layouts(model),
               "layouts: this model was not prepared by this Accelerator (prepare_model or prepare_pipeline)");
  EXPECT_ERROR(mine.get_state_dict(model),
               "get_state_dict: this model was not prepared by this Accelerator (prepare_model or prepare_pipeline)");
}
