#pragma once
// Internal: the flight recorder (Note [Flight recorder]).
//
// Note [Flight recorder]
// A hang's first question is which rank did not reach which operation. Every ProcessGroup keeps
// the last N operations it issued (collectives with their sequence number, point-to-point with the
// peer and the message's number between the pair), each with its op, size, dtype, state (issued,
// done, failed) and times: a ring of N entries (TANDEM_FLIGHT_RECORDER_ENTRIES, default 1000;
// TANDEM_FLIGHT_RECORDER=0 turns it off), under the group's lock the call takes anyway. The
// process's groups are dumped together, one file per rank, into the run's log folder
// (TANDEM_FLIGHT_RECORDER_DIR, else TANDEM_LOG_DIR/attempt_<restart>, which `tandem run` sets):
// when a collective or message fails or times out, on SIGUSR1 (which `tandem run` sends to the
// other workers when one fails, before it stops them), on a fatal signal, and at a non-zero exit.
// `tandem run` then reads every rank's file and prints the analysis (src/launch/flight_analysis.h;
// also `tandem doctor LOGDIR`). Unlike PyTorch's, it covers every backend and needs no Python.
//
// The file, flight_rank_<global rank>.txt, is lines of tab-separated fields (readable, and read by
// the launcher, which links no JSON library):
//   tandem-flight-recorder 1
//   rank <global> <world> <pid> <reason>
//   group <name> <global ranks, comma-separated>
//   op <kind C|S|R> <seq> <op> <peer global rank or -1> <numel> <dtype> <state> <issued us> <done us>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace tandem::comm::detail {

/// TANDEM_FLIGHT_RECORDER (default on) and TANDEM_FLIGHT_RECORDER_ENTRIES (default 1000).
bool flight_recorder_enabled();

class FlightRecord {
 public:
  enum class State { Issued, Done, Failed };
  /// `kind`: 'C' a collective (`seq`: its sequence number), 'S' a send, 'R' a receive (`seq`: the
  /// message's number between this rank and `peer`, a global rank).
  struct Entry {
    uint64_t id = 0;
    char kind = 'C';
    uint64_t seq = 0;
    std::string op;
    int peer = -1;
    int64_t numel = 0;
    std::string dtype;
    State state = State::Issued;
    int64_t issued_us = 0, done_us = 0;
  };
  FlightRecord(std::string group, std::vector<int> global_ranks, size_t capacity);
  /// Records an issued operation; returns its id for finish().
  uint64_t issue(char kind, uint64_t seq, std::string op, int peer, const at::Tensor* tensor);
  /// Marks operation `id` done or failed (nothing if the ring has moved past it).
  void finish(uint64_t id, bool ok);
  /// Operation `id`'s `work` was waited for: done, or for a NCCL work, which wait() only ordered
  /// on a stream (Note [Stream-ordered waits]), done when the device says so (its event), which
  /// sweep() asks; until then it stays "issued".
  void finish_waited(uint64_t id, const c10::intrusive_ptr<c10d::Work>& work);
  /// The device's half of it: `work` is done when its isCompleted() says so.
  void finish_on_device(uint64_t id, c10::intrusive_ptr<c10d::Work> work);
  /// Marks done (or failed) the stream-waited operations the device has finished. Not from a
  /// signal handler (it queries CUDA events).
  void sweep();
  /// Appends this group's lines to `out`.
  void write(std::string& out) const;

 private:
  std::string group_;
  std::vector<int> global_ranks_;
  mutable std::mutex mutex_;
  std::vector<Entry> ring_;
  uint64_t next_ = 0;
  std::vector<std::pair<uint64_t, c10::intrusive_ptr<c10d::Work>>> on_device_;  // finish_on_device, oldest first
  void sweep_locked();
};

/// A new group's record, known to the process's dumps (the first one also installs the triggers:
/// SIGUSR1, fatal signals, a non-zero exit). Null when the recorder is off.
std::shared_ptr<FlightRecord> new_flight_record(const std::string& group, const std::vector<int>& global_ranks,
                                                int global_rank, int world_size);

/// Writes every live group's record to this rank's file (Note [Flight recorder]), replacing an
/// earlier dump, with `reason`; the failures' dumps (`first_failure_only`) keep the first one.
/// Returns the file written, or empty when there is no folder to write to or nothing to write.
std::string dump_flight_records(const std::string& reason, bool first_failure_only = false);

}  // namespace tandem::comm::detail
