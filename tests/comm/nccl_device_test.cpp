// Note [Device binding]: which device a rank's NCCL backend gets, decided without a GPU.
#include <gtest/gtest.h>

#include "comm/nccl_device.h"

namespace tandem::comm::detail {
namespace {

TEST(NcclDevice, EachRankGetsItsLocalRanksDevice) {
  for (int local = 0; local < 8; ++local) {
    const auto d = choose_nccl_device(true, true, local, 8);
    EXPECT_EQ(d.index, local);
    EXPECT_EQ(d.unavailable, "");
  }
}

TEST(NcclDevice, ALocalRankWithoutADeviceGetsNoNcclAndAReasonNamingBothNumbers) {
  const auto d = choose_nccl_device(true, true, 3, 2);
  EXPECT_EQ(d.index, -1);
  EXPECT_EQ(d.unavailable, "LOCAL_RANK=3 has no CUDA device: 2 visible (one device per rank on a node: start at most 2 "
                           "workers per node, or check CUDA_VISIBLE_DEVICES)");
}

TEST(NcclDevice, NoDeviceNoBuildOrNotWantedSaySo) {
  EXPECT_EQ(choose_nccl_device(true, true, 0, 0).unavailable, "no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver)");
  EXPECT_EQ(choose_nccl_device(false, true, 0, 4).unavailable,
            "this build of Tandem has no CUDA path (configure with TANDEM_WITH_CUDA=ON)");
  EXPECT_EQ(choose_nccl_device(true, false, 0, 4).unavailable, "ProcessGroupOptions.use_nccl is false");
  for (const auto& d : {choose_nccl_device(true, true, 0, 0), choose_nccl_device(false, true, 0, 4),
                        choose_nccl_device(true, false, 0, 4), choose_nccl_device(true, true, -1, 4)}) {
    EXPECT_EQ(d.index, -1);
    EXPECT_NE(d.unavailable, "");
  }
}

}  // namespace
}  // namespace tandem::comm::detail
