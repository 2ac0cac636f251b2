// Uses the installed headers and library: a world of one all-reduces a tensor.
#include <cstdio>

#include <ATen/ATen.h>

#include "tandem/comm/process_group.h"
#include "tandem/version.h"

int main() {
  auto pg = tandem::comm::ProcessGroup::create(tandem::comm::World::from_env());
  at::Tensor t = at::arange(4, at::kFloat);
  pg->all_reduce(t);
  std::printf("consumer: tandem %s, all_reduce -> %s\n", tandem::version(),
              at::equal(t, at::arange(4, at::kFloat)) ? "ok" : "WRONG");
  return at::equal(t, at::arange(4, at::kFloat)) ? 0 : 1;
}
