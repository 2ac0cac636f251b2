#include "support/distributed_main.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "support/skip_code.h"
#include "tandem/error.h"

namespace tandem::test {
namespace {
std::shared_ptr<comm::ProcessGroup> g_pg;
}

comm::ProcessGroup& pg() { return *g_pg; }
std::shared_ptr<comm::ProcessGroup> shared_pg() { return g_pg; }

std::string shared_temp_folder(const std::string& prefix) {
  at::Tensor name = at::zeros({256}, at::kByte);
  if (g_pg->rank() == 0) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    const char* made = ::mkdtemp(pattern.data());
    // Left empty (every rank then fails on the empty name) when it cannot be made or would not fit.
    if (made && std::strlen(made) < 256) std::memcpy(name.data_ptr(), made, std::strlen(made));
  }
  g_pg->broadcast(name, 0);
  return std::string(static_cast<const char*>(name.data_ptr()));
}

bool every_rank_has_nccl() {
  at::Tensor mine = at::full({1}, g_pg->has_nccl() ? 1 : 0, at::kInt);
  g_pg->all_reduce(mine, comm::ReduceOp::Min);
  return mine.item<int>() == 1;
}

std::string why_no_nccl() {
  return g_pg->has_nccl() ? "another rank has no NCCL backend" : g_pg->nccl_unavailable();
}

int distributed_test_main(int argc, char** argv, const Scenarios& scenarios, const Injections& injections) {
  ::testing::InitGoogleTest(&argc, argv);
  int rank = -1;
  try {
    const auto world = comm::World::from_env();
    rank = world.rank;
    if (injections.before_group) {
      if (auto rc = injections.before_group(world)) return *rc;
    }
    auto options = comm::ProcessGroupOptions().timeout(std::chrono::seconds(120)).rendezvous_timeout(std::chrono::seconds(60));
    if (const char* ms = std::getenv("TANDEM_TEST_COLLECTIVE_TIMEOUT_MS")) {
      options.timeout(std::chrono::milliseconds(std::atol(ms)));
    }
    g_pg = comm::ProcessGroup::create(world, options);
    if (injections.after_group) {
      if (auto rc = injections.after_group(*g_pg)) return *rc;
    }
    at::set_num_threads(1);  // ranks share two cores
    if (argc > 1 && std::strncmp(argv[1], "--scenario=", 11) == 0) {
      auto it = scenarios.find(argv[1] + 11);
      TANDEM_CHECK(it != scenarios.end(), "unknown scenario '", argv[1] + 11, "'");
      return it->second();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", argv[0], rank, one_line(e).c_str());
    return 2;
  }
  const int rc = with_skip_code(RUN_ALL_TESTS());
  g_pg.reset();
  return rc;
}

}  // namespace tandem::test
