// The flight recorder's own record (src/comm/flight_recorder.h): when an operation counts as done.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"

// Note [Device completion]: an operation waited for on a stream (NCCL) is done when its work says
// the device finished it, not when wait() returned; one the device failed is "failed".
namespace {
class DeviceWork : public c10d::Work {
 public:
  bool finished = false, ok = true;
  bool isCompleted() override { return finished; }
  bool isSuccess() const override { return ok; }
};

std::string states_of(const tandem::comm::detail::FlightRecord& record) {
  std::string text, states;
  record.write(text);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("op\t", 0) != 0) continue;
    std::vector<std::string> fields;
    std::istringstream in(line);
    for (std::string f; std::getline(in, f, '\t');) fields.push_back(f);
    states += (states.empty() ? "" : " ") + fields.at(7);
  }
  return states;
}
}  // namespace

TEST(FlightRecord, AStreamWaitedOperationIsDoneWhenTheDeviceSaysSo) {
  tandem::comm::detail::FlightRecord record("world", {0, 1}, 8);
  auto first = c10::make_intrusive<DeviceWork>(), second = c10::make_intrusive<DeviceWork>();
  record.finish_on_device(record.issue('C', 1, "all_reduce", -1, nullptr), first);
  record.finish_on_device(record.issue('C', 2, "all_reduce", -1, nullptr), second);
  EXPECT_EQ(states_of(record), "issued issued") << "waited on a stream, not yet run";
  first->finished = true;
  record.sweep();
  EXPECT_EQ(states_of(record), "done issued");
  second->finished = true;
  second->ok = false;
  record.issue('C', 3, "broadcast", -1, nullptr);  // a new operation asks too
  EXPECT_EQ(states_of(record), "done failed issued");
}
