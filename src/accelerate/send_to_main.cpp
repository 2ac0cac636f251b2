#include "accelerate/send_to_main.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>

#include "tandem/error.h"

namespace tandem::accelerate {
namespace {
// The MPI backend moves at most 128 MiB per rank at once.
constexpr int64_t kPiece = int64_t{64} << 20;
}  // namespace

void send_to_main(const std::shared_ptr<comm::ProcessGroup>& pg, const std::string& what,
                  const std::function<std::string()>& build, const std::function<void(int, std::string)>& consume) {
  const int world = pg ? pg->size() : 1, rank = pg ? pg->rank() : 0;
  if (world == 1) return consume(0, build());
  std::string mine, failure;
  try {
    mine = build();
  } catch (const std::exception& e) {
    failure = one_line(e);
  }
  at::Tensor failed = at::full({1}, failure.empty() ? 0 : 1, at::kInt);
  pg->all_reduce(failed, comm::ReduceOp::Max);
  TANDEM_CHECK(failure.empty(), what, ": ", failure);
  TANDEM_CHECK(failed.item<int>() == 0, what, ": another process could not serialize its part (its error says "
                                        "why); nothing was written");
  const auto lengths = pg->all_gather(at::full({1}, static_cast<int64_t>(mine.size()), at::kLong));
  if (rank == 0) consume(0, std::move(mine));
  for (int r = 1; r < world; ++r) {
    if (rank != 0 && rank != r) continue;
    const int64_t total = lengths[static_cast<size_t>(r)].item<int64_t>();
    std::string bytes;
    if (rank == 0) bytes.reserve(static_cast<size_t>(total));
    for (int64_t at = 0; at < total; at += kPiece) {
      const int64_t n = std::min(kPiece, total - at);
      at::Tensor piece = at::empty({n}, at::kByte);
      if (rank == r) {
        std::memcpy(piece.data_ptr(), mine.data() + at, static_cast<size_t>(n));
        pg->send(piece, 0);
      } else {
        pg->recv(piece, r);
        bytes.append(static_cast<const char*>(piece.data_ptr()), static_cast<size_t>(n));
      }
    }
    if (rank == 0) consume(r, std::move(bytes));
  }
}


std::string broadcast_from_main(comm::ProcessGroup& pg, std::string bytes) {
  at::Tensor length = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  pg.broadcast(length, 0);
  const int64_t total = length.item<int64_t>();
  if (pg.rank() != 0) bytes.assign(static_cast<size_t>(total), '\0');
  for (int64_t at = 0; at < total; at += kPiece) {
    const int64_t n = std::min(kPiece, total - at);
    at::Tensor piece = at::empty({n}, at::kByte);
    if (pg.rank() == 0) std::memcpy(piece.data_ptr(), bytes.data() + at, static_cast<size_t>(n));
    pg.broadcast(piece, 0);
    if (pg.rank() != 0) std::memcpy(bytes.data() + at, piece.data_ptr(), static_cast<size_t>(n));
  }
  return bytes;
}

}  // namespace tandem::accelerate
