#include "tandem/zero/step_guards.h"

#include <string>

#include "tandem/error.h"

namespace tandem::zero {

bool agreed_step(comm::ProcessGroup& pg, const std::function<bool()>& step) {
  // Every rank must step, or skip, alike: the exchange after it is collective. A step that
  // throws or disagrees (a GradScaler without the process group) fails on every rank, not hangs.
  int status = 0;  // 1 stepped, 0 skipped, -1 failed
  std::string failure;
  try {
    status = step() ? 1 : 0;
  } catch (const std::exception& e) {
    status = -1;
    failure = one_line(e);
  }
  at::Tensor agreed = at::tensor({static_cast<double>(status), -static_cast<double>(status)}, at::kDouble);
  pg.all_reduce(agreed, comm::ReduceOp::Max);
  const int most = static_cast<int>(agreed[0].item<double>()), least = -static_cast<int>(agreed[1].item<double>());
  TANDEM_CHECK(least >= 0, "ZeRO: ", failure.empty() ? "another rank's optimizer step failed (its log says why)" : failure);
  TANDEM_CHECK(most == least,
               "ZeRO: the ranks disagree on whether to step (some stepped, some skipped): a GradScaler "
               "must check for inf/NaN across ranks (build it with the process group, as the Accelerator does)");
  return status == 1;
}

void check_groups_unchanged(const torch::optim::Optimizer& optimizer,
                            const std::vector<std::vector<at::Tensor>>& expected, const char* who) {
  const auto& groups = optimizer.param_groups();
  bool same = groups.size() == expected.size();
  for (size_t g = 0; same && g < expected.size(); ++g) {
    same = groups[g].params().size() == expected[g].size();
    for (size_t i = 0; same && i < expected[g].size(); ++i) same = groups[g].params()[i].is_same(expected[g][i]);
  }
  TANDEM_CHECK(same, who, ": the optimizer's param groups changed after it was sharded (a group or a parameter added "
                     "or removed); build a new ", who, " over the changed optimizer");
}

}  // namespace tandem::zero
