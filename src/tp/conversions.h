#pragma once
// The input and output movements of a plan's styles, shared by all the modules one parallelize
// call touched (Note [Shared conversions]).
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include "tandem/comm/placement.h"
#include "tandem/tp/functional.h"

namespace tandem::tp::detail {

class Conversions {
 public:
  explicit Conversions(Group group) : group_(std::move(group)) {}
  const Group& group() const { return group_; }

  /// A module's input, which arrives as `from` and which it computes on as `to`. A Replicate
  /// input the module computes on whole has its gradient all-reduced (copy_to). `module` names
  /// it in errors; `differentiable` false: integer inputs (token ids), moved without autograd.
  at::Tensor input(const at::Tensor& x, const comm::Placement& from, const comm::Placement& to,
                   const std::string& module, bool differentiable = true);
  /// A module's output, computed as `from` (Partial for a sum not yet reduced), leaving as `to`.
  at::Tensor output(const at::Tensor& x, const comm::Placement& from, const comm::Placement& to,
                    const std::string& module);

  /// On the first input of each module that should be the same on every rank of the group:
  /// compares a fingerprint of `x` across the group; a one-line error names the rank that differs.
  void check_replicated(const at::Tensor& x, const std::string& module);

 private:
  enum class Kind { CopyTo, Scatter, AllGather };
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> input;
    int64_t version = 0;
    Kind kind = Kind::CopyTo;
    int64_t dim = 0;
    bool grad_mode = false;
    c10::weak_intrusive_ptr<c10::TensorImpl> output;
    int64_t output_version = 0;  // a result changed in place since is not the conversion any more
  };
  at::Tensor shared(const at::Tensor& x, Kind kind, int64_t dim);
  static at::Tensor run(const at::Tensor& x, Kind kind, int64_t dim, const Group& group);

  Group group_;
  std::vector<Entry> recent_;
  std::set<std::string> checked_;
};

}  // namespace tandem::tp::detail
