#pragma once
// The main() of tests that run as every rank of a job (and as a world of one without launcher).
//
// It creates the process group from the environment (collective timeout 120 s, or
// TANDEM_TEST_COLLECTIVE_TIMEOUT_MS), then either runs the GoogleTest suite or, with
// `--scenario=NAME` as first argument, one failure scenario: code that is expected to end the
// job, run under `tandem run` by tests/expect_failure.sh, which checks the exit and the message.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "tandem/comm/process_group.h"

namespace tandem::test {

/// This process's group, for the test bodies.
comm::ProcessGroup& pg();
std::shared_ptr<comm::ProcessGroup> shared_pg();

/// A new folder every rank of pg() knows: rank 0 makes it under the temporary directory (named
/// `prefix`-XXXXXX), the others get its name by broadcast. Collective.
std::string shared_temp_folder(const std::string& prefix);

/// Whether every rank has an NCCL backend: a CPU all-reduce, so that all ranks skip a GPU test
/// together (one rank skipping while the others enter a collective would hang them).
bool every_rank_has_nccl();
/// Why a GPU test skips here: this rank's reason, or that another rank has no NCCL.
std::string why_no_nccl();

using Scenarios = std::map<std::string, std::function<int()>>;

/// Failure injections for the launcher tests: a returned value ends the process with that code.
struct Injections {
  std::function<std::optional<int>(const comm::World&)> before_group;   // before the rendezvous
  std::function<std::optional<int>(comm::ProcessGroup&)> after_group;  // once every rank joined
};

/// Call from main(): returns the exit code.
int distributed_test_main(int argc, char** argv, const Scenarios& scenarios = {}, const Injections& injections = {});

}  // namespace tandem::test
