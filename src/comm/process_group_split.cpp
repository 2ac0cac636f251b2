// ProcessGroup::split and ProcessGroup::new_group: subgroups of a process group.
//
// Note [Subgroups]
// A subgroup is a ProcessGroup of its own: its own Gloo (or MPI, or NCCL) backend over its
// members only, its own collective sequence numbers (Note [Collective sequence]: the same on
// every member), and its own scope of store keys, a PrefixStore "tandem/group/<n>/<color>/" over
// the parent's store, where n counts the subgroups made from that parent. Creation is collective
// over the parent, so n is the same on every rank, and two groups never share a key: not the
// backends' rendezvous, not the failure reports (Note [Naming the missing rank]), not the
// reducer's agreement on a failed backward. Under MPI the communicator is MPI_Comm_split of the
// parent's, which every rank of the parent calls, members or not.
#include <algorithm>
#include <functional>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/mpi_backend.h"
#include "tandem/comm/process_group.h"
#include "tandem/error.h"

namespace tandem::comm {
namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

// Every rank's value of `mine`, over the CPU backend (one all-gather of one int64 each).
std::vector<int64_t> gather_ints(ProcessGroup& pg, int64_t mine) {
  const auto parts = pg.all_gather(at::full({1}, mine, at::kLong));
  std::vector<int64_t> all;
  for (const auto& p : parts) all.push_back(p.item<int64_t>());
  return all;
}

}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, const std::string& name) {
  const auto colors = gather_ints(*this, color);
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) {
    if (colors[static_cast<size_t>(r)] == color) members.push_back(r);
  }
  return subgroup(color >= 0 ? members : std::vector<int>{}, color, name);
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  // Agree first, check after: a list one rank alone got wrong must fail every rank, not leave the
  // others waiting in the new group's rendezvous.
  std::string text = ranks_text(ranks);
  const auto fingerprints = gather_ints(*this, static_cast<int64_t>(std::hash<std::string>{}(text) >> 1));
  for (int r = 0; r < size(); ++r) {
    if (fingerprints[static_cast<size_t>(r)] != fingerprints[0]) {
      throw Error("new_group" + (name.empty() ? std::string() : " '" + name + "'") + ": " + describe_rank(r) +
                  " passed other ranks than " + describe_rank(0) + " (" + describe_rank(rank()) + " passed " + text +
                  "): every rank must pass the same list");
    }
  }
  std::vector<int> members = ranks;
  std::sort(members.begin(), members.end());
  TANDEM_CHECK(!members.empty(), "new_group: the list of ranks is empty");
  TANDEM_CHECK(std::adjacent_find(members.begin(), members.end()) == members.end(), "new_group: rank ",
               *std::adjacent_find(members.begin(), members.end()), " appears twice in ", text);
  TANDEM_CHECK(members.front() >= 0 && members.back() < size(), "new_group: ", text, " names rank ",
               members.front() < 0 ? members.front() : members.back(), ", but the group has ranks 0 to ", size() - 1);
  const bool member = std::binary_search(members.begin(), members.end(), rank());
  return subgroup(members, member ? 0 : -1, name);
}

std::shared_ptr<ProcessGroup> ProcessGroup::subgroup(const std::vector<int>& members, int color,
                                                     const std::string& name) {
  const int index = splits_++;  // Note [Subgroups]: the same on every rank of this group
  if (color < 0) {
    if (cpu_kind_ == CpuBackend::Mpi) detail::split_mpi_backend(cpu_, -1, -1, 0);  // MPI's split is collective
    return nullptr;
  }
  std::shared_ptr<ProcessGroup> group(new ProcessGroup(world_, options_));
  group->subgroup_ = true;
  group->name_ = name.empty() ? name_ + "/" + std::to_string(index) + "." + std::to_string(color) : name;
  group->size_ = static_cast<int>(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rank()) group->rank_ = static_cast<int>(i);
    group->global_ranks_.push_back(global_rank(members[i]));
  }
  group->store_ = c10::make_intrusive<c10d::PrefixStore>(
      "tandem/group/" + std::to_string(index) + "/" + std::to_string(color), store_);
  group->debug_level_ = debug_level_;
  group->cpu_kind_ = cpu_kind_;
  group->make_backends(cpu_kind_ == CpuBackend::Mpi ? cpu_ : nullptr, color);
  return group;
}

}  // namespace tandem::comm
