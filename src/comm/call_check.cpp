#include "comm/call_check.h"

#include <ATen/ATen.h>

#include "comm/failure_report.h"
#include "tandem/error.h"

namespace tandem::comm::detail {

void check_same_call(c10d::Backend& backend, const CollectiveCall& call, int size, std::chrono::milliseconds timeout) {
  const auto mine = call.encode();
  std::vector<at::Tensor> input{at::tensor(mine, at::kLong)};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < size; ++r) output[0].push_back(at::empty_like(input[0]));
  c10d::AllgatherOptions options;
  options.timeout = timeout;
  auto work = backend.allgather(output, input, options);
  work->wait(timeout);

  // Ranks grouped by the call they make, in rank order of each group's first member.
  std::vector<CollectiveCall> calls;
  std::vector<std::vector<int>> members;
  bool differ = false;
  for (int r = 0; r < size; ++r) {
    const auto theirs = CollectiveCall::decode(output[0][static_cast<size_t>(r)].data_ptr<int64_t>());
    differ = differ || !theirs.same_call(call);
    size_t g = 0;
    while (g < calls.size() && !calls[g].same_call(theirs)) ++g;
    if (g == calls.size()) {
      calls.push_back(theirs);
      members.emplace_back();
    }
    members[g].push_back(r);
  }
  if (!differ) return;
  std::string text = "collective #" + std::to_string(call.seq) + " differs across ranks (TANDEM_DEBUG=DETAIL): ";
  for (size_t g = 0; g < calls.size(); ++g) {
    text += (g ? "; " : "") + std::string(members[g].size() > 1 ? "ranks " : "rank ") + list_ranks(members[g]) +
            (members[g].size() > 1 ? " call " : " calls ") + "#" + std::to_string(calls[g].seq) + " " +
            calls[g].describe_with_shape();
  }
  throw Error(text);
}

}  // namespace tandem::comm::detail
