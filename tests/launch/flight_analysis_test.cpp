// The flight records' analysis (src/launch/flight_analysis.h) on records written by hand: what
// `tandem run` and `tandem doctor` print must name the rank that did not reach a collective, the
// ranks that disagree at one sequence number, the message without a partner, and each rank's last
// completed operation; a malformed record is a one-line error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "launch/flight_analysis.h"
#include "support/errors.h"

namespace launch = tandem::launch;
using ::testing::ElementsAre;

namespace {

std::string temp_folder() {
  std::string pattern = ::testing::TempDir() + "flight-XXXXXX";
  return ::mkdtemp(pattern.data());
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A rank's record of the world group of 3: collectives 1..last, each done except `pending`.
std::string record(int rank, const std::string& reason, const std::string& ops) {
  return "tandem-flight-recorder\t1\nrank\t" + std::to_string(rank) + "\t3\t100\t" + reason + "\ngroup\tworld\t0,1,2\n" +
         ops;
}

std::string op(char kind, int seq, const std::string& what, int peer, const std::string& state, int at) {
  return std::string("op\t") + kind + "\t" + std::to_string(seq) + "\t" + what + "\t" + std::to_string(peer) +
         "\t4\tFloat\t" + state + "\t" + std::to_string(at) + "\t" + std::to_string(state == "done" ? at + 1 : 0) + "\n";
}

}  // namespace

TEST(FlightAnalysis, NamesTheRankThatDidNotReachACollectiveAndEachRanksLastOperation) {
  const std::string dir = temp_folder();
  const std::string ar = "all_reduce (sum) of Float[4] on cpu";
  write(dir + "/flight_rank_0.txt", record(0, "timeout", op('C', 1, ar, -1, "done", 10) + op('C', 2, ar, -1, "failed", 20)));
  write(dir + "/flight_rank_1.txt", record(1, "SIGUSR1", op('C', 1, ar, -1, "done", 10)));
  // Rank 2 left none.
  const auto lines = launch::analyze_flight_dumps(launch::read_flight_dumps(dir));
  EXPECT_THAT(lines, ElementsAre("the world group: rank 1 did not reach collective #2 (" + ar + ", issued by rank 0); its "
                                 "last was #1, " + ar,
                                 "rank 2 left no flight record (it exited, or was killed before it could write one)",
                                 "rank 0 (dumped on timeout): last completed collective #1, " + ar +
                                     " on the world group; failed: collective #2, " + ar + " on the world group",
                                 "rank 1 (dumped on SIGUSR1): last completed collective #1, " + ar + " on the world group"));
}

TEST(FlightAnalysis, NamesRanksThatDisagreeAndMessagesWithoutAPartner) {
  const std::string dir = temp_folder();
  const std::string ar = "all_reduce (sum) of Float[4] on cpu", bc = "broadcast (root 0) of Float[4] on cpu";
  ::mkdir((dir + "/attempt_0").c_str(), 0755);
  ::mkdir((dir + "/attempt_1").c_str(), 0755);  // the last attempt is read
  write(dir + "/attempt_0/flight_rank_0.txt", "garbage");
  write(dir + "/attempt_1/flight_rank_0.txt", record(0, "x", op('C', 1, ar, -1, "issued", 10) + op('S', 1, "send", 2, "issued", 11)));
  write(dir + "/attempt_1/flight_rank_1.txt", record(1, "y", op('C', 1, bc, -1, "issued", 10) + op('R', 1, "recv", 0, "issued", 12)));
  write(dir + "/attempt_1/flight_rank_2.txt", record(2, "z", op('C', 1, bc, -1, "issued", 10)));
  const auto lines = launch::analyze_flight_dumps(launch::read_flight_dumps(dir));
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0], "the world group: the ranks disagree at collective #1: " + ar + " on rank 0; " + bc + " on ranks 1, 2");
  EXPECT_EQ(lines[1], "the world group: rank 0's send #1 to rank 2 (4 Float) is still waiting: rank 2 has not posted that "
                      "receive (its last receive from rank 0: none)");
  EXPECT_EQ(lines[2], "the world group: rank 1's receive #1 from rank 0 (4 Float) is still waiting: rank 0 has not sent it "
                      "(its last send to rank 1: none)");
}

TEST(FlightAnalysis, AMalformedRecordIsAOneLineError) {
  const std::string dir = temp_folder();
  write(dir + "/flight_rank_0.txt", "tandem-flight-recorder\t1\nrank\t0\t2\t1\tr\ngroup\tworld\t0,1\nop\tC\tx\ty\n");
  EXPECT_ERROR(launch::read_flight_dumps(dir), dir + "/flight_rank_0.txt:4: unexpected line 'op\tC\tx\ty'");
  write(dir + "/flight_rank_0.txt", "something else\n");
  EXPECT_ERROR(launch::read_flight_dumps(dir), dir + "/flight_rank_0.txt:1: not a Tandem flight record");
  EXPECT_TRUE(launch::read_flight_dumps(temp_folder()).empty());
}
