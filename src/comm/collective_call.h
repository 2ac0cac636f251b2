#pragma once
// Internal: what one collective call is, as the ranks compare it (debug mode) and report it when
// it fails (Note [Collective sequence]).
//
// Note [Collective sequence]
// Every collective a ProcessGroup issues gets the next sequence number, starting at 1. The ranks
// issue collectives in the same order, so the same number means the same call on every rank: a
// failure can say "collective #12" and mean one call of the whole job.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem::comm::detail {

enum class CollectiveKind : int64_t {
  AllReduce = 1,
  Broadcast = 2,
  AllGather = 3,
  Barrier = 4,
  ReduceScatter = 5,  // flat: the call's tensor is the input, all shards
  AllGatherInto = 6,  // flat: the call's tensor is the input, this rank's shard
};

struct CollectiveCall {
  uint64_t seq = 0;
  CollectiveKind kind = CollectiveKind::Barrier;
  int64_t detail = 0;       // ReduceOp of an all_reduce, root of a broadcast
  int64_t dtype = -1;       // c10::ScalarType; -1 without a tensor (barrier)
  int64_t device_type = -1;
  int64_t device_index = -1;
  int64_t numel = 0;
  int64_t ndim = 0;
  std::vector<int64_t> sizes;  // after decode(): the first kMaxDims of ndim
  uint64_t flight = UINT64_MAX;  // its entry in the group's flight record (not encoded)

  static CollectiveCall of(uint64_t seq, CollectiveKind kind, const at::Tensor* tensor, int64_t detail = 0);

  /// "all_reduce of 4 Float on cpu (sum)": the words error messages have always used.
  std::string describe() const;
  /// The same with the shape: "all_reduce (sum) of Float[2, 2] on cpu".
  std::string describe_with_shape() const;

  /// A fixed-length record for an all-gather between ranks; decode(encode()) keeps the first
  /// kMaxDims dimensions (ndim and numel are always exact).
  static constexpr int64_t kMaxDims = 8;
  static constexpr int64_t kEncodedLength = 8 + kMaxDims;
  std::vector<int64_t> encode() const;
  static CollectiveCall decode(const int64_t* values);

  bool same_call(const CollectiveCall& other) const;
};

const char* to_string(CollectiveKind kind);

}  // namespace tandem::comm::detail
