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
//
// Note [Connected before returned]
// Gloo's full-mesh connect is not a barrier. The side of a pair that initiates the connection is
// done once it has written its sequence number; the other side is done only when its listener has
// handed it the socket, which can be much later. A group made and dropped at once (a DeviceMesh
// built to read its shape, a group made for one collective that only some members reach) could
// then be destroyed by a fast member while a slower one was still connecting to it: the slower one
// read EOF on a pair it had just been given, and its creation failed with "Connection closed by
// peer" (seen once in CI, comm.subgroups.gloo3 under ASan). So no member returns from creating a
// Gloo subgroup until every member has: each counts itself in on the group's own store and waits
// for the count, as PyTorch's new_group did with its store-based barrier. MPI's split and NCCL's
// init are collective already.
#include <algorithm>
#include <cstdlib>
#include <functional>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/mpi_backend.h"
#include "tandem/comm/agreement.h"
#include "tandem/comm/process_group.h"
#include "tandem/error.h"

namespace tandem::comm {
namespace {

std::string bracketed_ranks(const std::vector<int>& ranks) {
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
  // One all-gather of (color, the name's fingerprint): every rank must be making the same split
  // (Note [Agreement before waiting] in docs/design/comm.md); ranks that make their subgroups in
  // another order would otherwise pair one group's collectives with another's.
  const int64_t print = static_cast<int64_t>(std::hash<std::string>{}(name) >> 1);
  const auto parts = all_gather(at::tensor({static_cast<int64_t>(color), print}, at::kLong));
  std::vector<int64_t> colors;
  bool same_name = true;
  for (const auto& p : parts) {
    colors.push_back(p[0].item<int64_t>());
    same_name = same_name && p[1].item<int64_t>() == print;
  }
  if (!same_name) Agreement("split").field("the name of the group being made", name).check(*this);
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) {
    if (colors[static_cast<size_t>(r)] == color) members.push_back(r);
  }
  return subgroup(color >= 0 ? members : std::vector<int>{}, color, name);
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  // Agree first, check after: a list one rank alone got wrong must fail every rank, not leave the
  // others waiting in the new group's rendezvous.
  std::string text = bracketed_ranks(ranks);
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
  group->nccl_rules_ = nccl_rules_;
  if (cpu_kind_ == CpuBackend::Mpi) {
    group->make_backends(cpu_, color);
    return group;
  }
  try {
    group->make_backends(nullptr, color);
  } catch (...) {
    group->count_in_connected(false);
    throw;
  }
  group->count_in_connected(true);
  return group;
}

// Note [Connected before returned]. A member whose creation failed wakes the others at once, so
// they fail naming it rather than waiting for the timeout.
void ProcessGroup::count_in_connected(bool connected) {
  if (size_ < 2) return;
  const std::string count = "tandem/connected/count", all = "tandem/connected/all",
                    failed = "tandem/connected/failed";
  if (!connected) {
    try {
      const std::string me = std::to_string(rank_);
      store_->set(failed, std::vector<uint8_t>(me.begin(), me.end()));
      store_->set(all, std::vector<uint8_t>{1});
    } catch (...) {  // the store is gone too: the others time out, naming none
    }
    return;
  }
  if (store_->add(count, 1) == size_) store_->set(all, std::vector<uint8_t>{1});
  const std::string where = "creating the process group '" + name_ + "' on " + describe_rank(rank_) + " failed: ";
  try {
    store_->wait({all}, options_.timeout());
  } catch (const std::exception&) {
    std::string arrived = "not all";
    try {
      arrived = "only " + std::to_string(store_->add(count, 0));
    } catch (...) {
    }
    throw Error(where + arrived + " of its " + std::to_string(size_) + " members finished connecting within " +
                std::to_string(options_.timeout().count()) + " ms (Note [Connected before returned])");
  }
  if (store_->check({failed})) {
    const auto bytes = store_->get(failed);
    const int other = std::atoi(std::string(bytes.begin(), bytes.end()).c_str());
    throw Error(where + describe_rank(other) + " could not connect (its own error says why)");
  }
}

}  // namespace tandem::comm
