// The parallelism plan (Note [Parallelism plan]): the sizes left open, the strategy, and every
// layout that cannot be run, each with its one-line message.
#include <gtest/gtest.h>

#include "support/errors.h"
#include "tandem/accelerate/options.h"
#include "tandem/accelerate/parallelism.h"

using tandem::ParallelismConfig;
using tandem::ParallelismPlan;
using tandem::Strategy;
using tandem::plan_parallelism;

namespace {

std::string sizes(const ParallelismPlan& p) {
  return std::to_string(p.replicate) + "," + std::to_string(p.shard) + "," + std::to_string(p.tp) + "," +
         std::to_string(p.pp);
}

}  // namespace

TEST(ParallelismPlan, UnsetMeansWhatTheStrategyAlwaysMeant) {
  EXPECT_EQ(sizes(plan_parallelism({}, Strategy::Ddp, 4)), "4,1,1,1");  // DDP replicates over everyone
  EXPECT_EQ(sizes(plan_parallelism({}, Strategy::Fsdp, 4)), "1,4,1,1");  // FSDP shards over everyone
  EXPECT_EQ(sizes(plan_parallelism({}, Strategy::Auto, 4)), "4,1,1,1");
  EXPECT_EQ(sizes(plan_parallelism({}, Strategy::Single, 1)), "1,1,1,1");
  EXPECT_EQ(plan_parallelism({}, Strategy::Auto, 4).strategy, Strategy::Auto);  // left to the launch
  EXPECT_FALSE(plan_parallelism({}, Strategy::Fsdp, 4).hybrid());
}

TEST(ParallelismPlan, ShardsWithReplicasAreHsdp) {
  const auto plan = plan_parallelism(ParallelismConfig().shard_size(2), Strategy::Fsdp, 8);
  EXPECT_EQ(sizes(plan), "4,2,1,1");
  EXPECT_TRUE(plan.hybrid());
  EXPECT_EQ(plan.describe(), "replicate 4 x shard 2");
  // Auto with shards picks FSDP; a replicate size leaves the shards the rest.
  EXPECT_EQ(plan_parallelism(ParallelismConfig().shard_size(2), Strategy::Auto, 4).strategy, Strategy::Fsdp);
  EXPECT_EQ(sizes(plan_parallelism(ParallelismConfig().replicate_size(2), Strategy::Fsdp, 8)), "2,4,1,1");
  EXPECT_EQ(sizes(plan_parallelism(ParallelismConfig().replicate_size(2).shard_size(2), Strategy::Fsdp, 4)), "2,2,1,1");
  EXPECT_EQ(plan_parallelism({}, Strategy::Single, 1).describe(), "1");
}

TEST(ParallelismPlan, TensorParallelismTakesItsShareFirst) {
  EXPECT_EQ(sizes(plan_parallelism(ParallelismConfig().tp_size(2), Strategy::Ddp, 4)), "2,1,2,1");
  EXPECT_EQ(sizes(plan_parallelism(ParallelismConfig().tp_size(2), Strategy::Fsdp, 8)), "1,4,2,1");
  EXPECT_EQ(sizes(plan_parallelism(ParallelismConfig().tp_size(2).shard_size(2), Strategy::Auto, 8)), "2,2,2,1");
  EXPECT_EQ(plan_parallelism(ParallelismConfig().tp_size(2), Strategy::Fsdp, 4).describe(), "shard 2 x tp 2");
  EXPECT_EQ(sizes(plan_parallelism(ParallelismConfig().tp_size(4), Strategy::Ddp, 4)), "1,1,4,1");
}

TEST(ParallelismPlan, PipelineStagesTakeTheirShareFirst) {
  EXPECT_EQ(sizes(plan_parallelism(ParallelismConfig().pp_size(2), Strategy::Ddp, 4)), "2,1,1,2");
  EXPECT_EQ(sizes(plan_parallelism(ParallelismConfig().pp_size(2), Strategy::Fsdp, 8)), "1,4,1,2");
  EXPECT_EQ(sizes(plan_parallelism(ParallelismConfig().pp_size(4), Strategy::Auto, 4)), "1,1,1,4");
  EXPECT_EQ(plan_parallelism(ParallelismConfig().pp_size(2).shard_size(2), Strategy::Fsdp, 8).describe(),
            "pp 2 x replicate 2 x shard 2");
}

TEST(ParallelismPlan, ImpossibleLayoutsAreOneLineErrors) {
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().shard_size(3), Strategy::Fsdp, 4),
               "parallelism: replicate_size x shard_size x tp_size x pp_size = 0 x 3 x 1 x 1 does not divide the 4 "
               "processes launched: the sizes must multiply to the number of processes");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().replicate_size(2).shard_size(3), Strategy::Fsdp, 4),
               "parallelism: replicate_size x shard_size x tp_size x pp_size = 2 x 3 x 1 x 1 is not the 4 processes "
               "launched: the sizes must multiply to the number of processes");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().replicate_size(1).shard_size(2), Strategy::Fsdp, 4),
               "parallelism: replicate_size x shard_size x tp_size x pp_size = 1 x 2 x 1 x 1 is not the 4 processes "
               "launched: the sizes must multiply to the number of processes");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().replicate_size(2), Strategy::Ddp, 4),
               "parallelism: replicate_size x shard_size x tp_size x pp_size = 2 x 1 x 1 x 1 is not the 4 processes "
               "launched: the sizes must multiply to the number of processes");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().shard_size(2), Strategy::Ddp, 4),
               "parallelism: shard_size 2 shards the parameters, which Strategy::ddp does not: use Strategy::Fsdp "
               "(or Auto), or shard_size 1");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().tp_size(3), Strategy::Ddp, 4),
               "parallelism: replicate_size x shard_size x tp_size x pp_size = 0 x 0 x 3 x 1 does not divide the 4 "
               "processes launched: the sizes must multiply to the number of processes");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().tp_size(2), Strategy::DataParallel, 2),
               "parallelism: tp_size 2 with Strategy::dp: tensor parallelism runs one process per piece of each "
               "layer; use Strategy::Ddp or Fsdp (or Auto) for the other dimensions");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().pp_size(2).tp_size(2), Strategy::Ddp, 4),
               "parallelism: tp_size 2 with pp_size 2: tensor parallelism inside pipeline stages is not built yet; "
               "use one of the two");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().pp_size(2), Strategy::DataParallel, 2),
               "parallelism: pp_size 2 with Strategy::dp: pipeline stages run one process each; use Strategy::Ddp or "
               "Fsdp (or Auto) for the other dimensions");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().pp_size(3), Strategy::Ddp, 4),
               "parallelism: replicate_size x shard_size x tp_size x pp_size = 0 x 0 x 1 x 3 does not divide the 4 "
               "processes launched: the sizes must multiply to the number of processes");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().tp_size(0), Strategy::Ddp, 4),
               "parallelism: tp_size 0 must be at least 1");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().replicate_size(-1), Strategy::Ddp, 4),
               "parallelism: replicate_size -1 must be at least 0 (0: what the other sizes leave)");
  EXPECT_ERROR(plan_parallelism(ParallelismConfig().shard_size(-2), Strategy::Fsdp, 4),
               "parallelism: shard_size -2 must be at least 0 (0: what the other sizes leave under Strategy::Fsdp, "
               "else 1)");
}
