#include "tandem/ddp/options.h"

#include "tandem/error.h"

namespace tandem::ddp {

std::vector<int64_t> bucket_size_limits(const DistributedDataParallelOptions& options) {
  const auto cap = static_cast<int64_t>(options.bucket_cap_mb() * 1024 * 1024);
  const auto first = static_cast<int64_t>(options.first_bucket_mb() * 1024 * 1024);
  if (cap <= 0) throw Error("DDP: bucket_cap_mb must be positive (got " + std::to_string(options.bucket_cap_mb()) + ")");
  if (first <= 0 || first >= cap) return {cap};
  return {first, cap};
}

}  // namespace tandem::ddp
