#pragma once
// The flight recorder's dumps, read back and compared across ranks (Note [Flight recorder] in
// src/comm/flight_recorder.h): which rank did not reach which operation, which ranks disagree at
// one sequence number, which message has no partner, and each rank's last completed operation.
// Used by `tandem run` when a job fails and by `tandem doctor LOGDIR`. LibTorch-free.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::launch {

struct FlightOp {
  char kind = 'C';   // 'C' collective, 'S' send, 'R' receive
  uint64_t seq = 0;  // the collective's sequence number, or the message's number between the pair
  std::string op;
  int peer = -1;  // global rank (point-to-point)
  int64_t numel = 0;
  std::string dtype;
  std::string state;  // issued, done, failed
  int64_t issued_us = 0, done_us = 0;  // this process's steady clock
};

struct FlightGroup {
  std::string name;
  std::vector<int> ranks;  // global ranks, in group order
  std::vector<FlightOp> ops;
};

struct FlightDump {
  int rank = 0, world = 0;
  std::string reason;
  std::vector<FlightGroup> groups;
};

/// The dumps in `folder` (flight_rank_*.txt), or in its last attempt_<n> folder when it has
/// attempts (a `tandem run` log folder). Throws tandem::Error for a malformed file.
std::vector<FlightDump> read_flight_dumps(const std::string& folder);

/// The findings, one line each, most telling first; empty when there is nothing to say.
std::vector<std::string> analyze_flight_dumps(const std::vector<FlightDump>& dumps);

/// Whether global rank `rank`'s worker has a flight recorder that dumps on SIGUSR1 (it leaves
/// flight_rank_<rank>.armed in `folder`); a worker without one would die of SIGUSR1.
bool flight_recorder_armed(const std::string& folder, int rank);
/// Whether rank `rank` dumped into `folder` at `since_ns` (CLOCK_REALTIME) or later.
bool flight_dumped_since(const std::string& folder, int rank, int64_t since_ns);

}  // namespace tandem::launch
