// The smallest Tandem program: every rank contributes its rank number, and all of them learn the
// sum. Run it as a world of one (`./hello_allreduce`) or as N ranks:
//   tandem run --nproc-per-node 2 -- ./hello_allreduce
#include <cstdio>

#include <ATen/ATen.h>

#include "tandem/comm/process_group.h"
#include "tandem/error.h"

int main() {
  try {
    auto world = tandem::comm::World::from_env();
    auto pg = tandem::comm::ProcessGroup::create(world);

    at::Tensor mine = at::full({4}, static_cast<float>(world.rank + 1));
    pg->all_reduce(mine, tandem::comm::ReduceOp::Sum);

    const float expected = world.world_size * (world.world_size + 1) / 2.0f;
    std::printf("%s: all_reduce(sum) of rank+1 = %.0f (expected %.0f)\n", world.describe().c_str(),
                mine[0].item<float>(), expected);
    pg->barrier();
    return mine[0].item<float>() == expected ? 0 : 1;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "hello_allreduce: %s\n", e.what());
    return 2;
  }
}
