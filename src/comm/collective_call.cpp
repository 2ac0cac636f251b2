#include "comm/collective_call.h"

#include <algorithm>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "tandem/comm/process_group.h"

namespace tandem::comm::detail {

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::Barrier: return "barrier";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllGatherInto: return "all_gather_into";
  }
  return "unknown collective";
}

CollectiveCall CollectiveCall::of(uint64_t seq, CollectiveKind kind, const at::Tensor* tensor, int64_t detail) {
  CollectiveCall call;
  call.seq = seq;
  call.kind = kind;
  call.detail = detail;
  if (tensor && tensor->defined()) {
    call.dtype = static_cast<int64_t>(tensor->scalar_type());
    call.device_type = static_cast<int64_t>(tensor->device().type());
    call.device_index = tensor->device().index();
    call.numel = tensor->numel();
    call.sizes = tensor->sizes().vec();
    call.ndim = tensor->dim();
  }
  return call;
}

namespace {

std::string detail_of(const CollectiveCall& call) {
  if (call.kind == CollectiveKind::AllReduce || call.kind == CollectiveKind::ReduceScatter) {
    return to_string(static_cast<ReduceOp>(call.detail));
  }
  if (call.kind == CollectiveKind::Broadcast) return "root " + std::to_string(call.detail);
  return "";
}

std::string device_of(const CollectiveCall& call) {
  return c10::Device(static_cast<c10::DeviceType>(call.device_type), static_cast<c10::DeviceIndex>(call.device_index)).str();
}

std::string dtype_of(const CollectiveCall& call) {
  return c10::toString(static_cast<c10::ScalarType>(call.dtype));
}

}  // namespace

std::string CollectiveCall::describe() const {
  std::string text = to_string(kind);
  if (dtype >= 0) text += " of " + std::to_string(numel) + " " + dtype_of(*this) + " on " + device_of(*this);
  const std::string extra = detail_of(*this);
  if (!extra.empty()) text += " (" + extra + ")";
  return text;
}

std::string CollectiveCall::describe_with_shape() const {
  std::string text = to_string(kind);
  const std::string extra = detail_of(*this);
  if (!extra.empty()) text += " (" + extra + ")";
  if (dtype < 0) return text;
  text += " of " + dtype_of(*this) + "[";
  for (size_t d = 0; d < sizes.size(); ++d) text += (d ? ", " : "") + std::to_string(sizes[d]);
  if (static_cast<int64_t>(sizes.size()) < ndim) text += ", ...";
  return text + "] on " + device_of(*this);
}

std::vector<int64_t> CollectiveCall::encode() const {
  std::vector<int64_t> values(kEncodedLength, -1);
  values[0] = static_cast<int64_t>(seq);
  values[1] = static_cast<int64_t>(kind);
  values[2] = detail;
  values[3] = dtype;
  values[4] = device_type;
  values[5] = device_index;
  values[6] = ndim;
  values[7] = numel;
  for (size_t d = 0; d < sizes.size() && static_cast<int64_t>(d) < kMaxDims; ++d) values[8 + d] = sizes[d];
  return values;
}

CollectiveCall CollectiveCall::decode(const int64_t* values) {
  CollectiveCall call;
  call.seq = static_cast<uint64_t>(values[0]);
  call.kind = static_cast<CollectiveKind>(values[1]);
  call.detail = values[2];
  call.dtype = values[3];
  call.device_type = values[4];
  call.device_index = values[5];
  call.numel = values[7];
  call.ndim = std::max<int64_t>(0, values[6]);
  for (int64_t d = 0; d < std::min(call.ndim, kMaxDims); ++d) call.sizes.push_back(values[8 + d]);
  return call;
}

bool CollectiveCall::same_call(const CollectiveCall& other) const {
  // Device indices may differ between ranks (cuda:0 on one, cuda:1 on another): not compared.
  auto mine = encode(), theirs = other.encode();
  mine[5] = theirs[5] = 0;
  return mine == theirs;
}

}  // namespace tandem::comm::detail
