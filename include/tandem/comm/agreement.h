#pragma once
// Agreement before waiting: the settings every rank of a group must share, checked once, cheaply.
//
// A rule that must hold on every rank (the pipeline's stage count, a mesh's shape, the order in
// which objects that communicate were made) is otherwise enforced by luck: one rank that differs
// waits in a collective the others never call, until a timeout minutes later names nothing useful.
// An Agreement is checked by one all-gather of one fingerprint per rank over the group's CPU
// backend; only when fingerprints differ do the ranks exchange their settings in full, and then
// every rank throws the same one line naming the field, each value and the ranks that hold it:
//
//   pp: the ranks of group 'pp' disagree on the schedule's microbatches: 4 on ranks 0, 2; 8 on rank 1
//
// Example:
//   tandem::comm::Agreement("pp: the schedule")
//       .field("kind", "1F1B").field("microbatches", m).check(group);
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::comm {

class ProcessGroup;

class Agreement {
 public:
  /// `what` leads the error ("pp: the schedule"; "DeviceMesh").
  explicit Agreement(std::string what) : what_(std::move(what)) {}
  Agreement& field(const std::string& name, const std::string& value);
  Agreement& field(const std::string& name, int64_t value) { return field(name, std::to_string(value)); }
  Agreement& field(const std::string& name, int value) { return field(name, std::to_string(value)); }
  Agreement& field(const std::string& name, const char* value) { return field(name, std::string(value)); }
  /// Collective over `group` (every rank calls it at the same point): returns when every rank has
  /// the same fields, else throws tandem::Error on every rank, naming the first field that differs.
  void check(ProcessGroup& group) const;

 private:
  std::string what_;
  std::vector<std::pair<std::string, std::string>> fields_;
};

}  // namespace tandem::comm
