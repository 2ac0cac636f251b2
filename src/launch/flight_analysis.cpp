#include "launch/flight_analysis.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "common/ranks_text.h"
#include "tandem/error.h"

namespace tandem::launch {
namespace {

using tandem::detail::ranks_text;

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(line);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

std::vector<std::string> entries_of(const std::string& folder) {
  std::vector<std::string> names;
  if (DIR* dir = ::opendir(folder.c_str())) {
    while (dirent* e = ::readdir(dir)) names.emplace_back(e->d_name);
    ::closedir(dir);
  }
  std::sort(names.begin(), names.end());
  return names;
}

FlightDump read_dump(const std::string& path) {
  std::ifstream in(path);
  TANDEM_CHECK(in, "cannot read the flight record ", path);
  FlightDump dump;
  std::string line;
  size_t number = 0;
  auto bad = [&](const std::string& why) { return Error(path + ":" + std::to_string(number) + ": " + why); };
  while (std::getline(in, line)) {
    ++number;
    const auto f = split(line, '\t');
    if (f.empty()) continue;
    try {
      if (number == 1) {
        if (f[0] != "tandem-flight-recorder") throw bad("not a Tandem flight record");
      } else if (f[0] == "rank" && f.size() >= 5) {
        dump.rank = std::stoi(f[1]);
        dump.world = std::stoi(f[2]);
        dump.reason = f[4];
      } else if (f[0] == "group" && f.size() >= 3) {
        FlightGroup g;
        g.name = f[1];
        for (const auto& r : split(f[2], ',')) g.ranks.push_back(std::stoi(r));
        dump.groups.push_back(std::move(g));
      } else if (f[0] == "op" && f.size() >= 10 && !dump.groups.empty()) {
        FlightOp op;
        op.kind = f[1].empty() ? '?' : f[1][0];
        op.seq = std::stoull(f[2]);
        op.op = f[3];
        op.peer = std::stoi(f[4]);
        op.numel = std::stoll(f[5]);
        op.dtype = f[6];
        op.state = f[7];
        op.issued_us = std::stoll(f[8]);
        op.done_us = std::stoll(f[9]);
        dump.groups.back().ops.push_back(std::move(op));
      } else {
        throw bad("unexpected line '" + line + "'");
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception&) {
      throw bad("a field is not a number in '" + line + "'");
    }
  }
  TANDEM_CHECK(number > 0, path, " is empty");
  return dump;
}

std::string describe(const FlightOp& op) {
  if (op.kind == 'C') return "collective #" + std::to_string(op.seq) + ", " + op.op;
  const bool send = op.kind == 'S';
  return std::string(send ? "send" : "receive") + " #" + std::to_string(op.seq) + (send ? " to rank " : " from rank ") +
         std::to_string(op.peer) + " (" + std::to_string(op.numel) + " " + op.dtype + ")";
}

std::string group_text(const FlightGroup& g) {
  return g.name == "world" ? std::string("the world group") : "group '" + g.name + "'";
}

}  // namespace

std::vector<FlightDump> read_flight_dumps(const std::string& folder) {
  std::string where = folder;
  int last_attempt = -1;
  for (const auto& name : entries_of(folder)) {
    if (name.rfind("attempt_", 0) == 0) last_attempt = std::max(last_attempt, std::atoi(name.c_str() + 8));
  }
  if (last_attempt >= 0) where = folder + "/attempt_" + std::to_string(last_attempt);
  std::vector<FlightDump> dumps;
  for (const auto& name : entries_of(where)) {
    if (name.rfind("flight_rank_", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".txt") == 0) {
      dumps.push_back(read_dump(where + "/" + name));
    }
  }
  std::sort(dumps.begin(), dumps.end(), [](const FlightDump& a, const FlightDump& b) { return a.rank < b.rank; });
  return dumps;
}

std::vector<std::string> analyze_flight_dumps(const std::vector<FlightDump>& dumps) {
  std::vector<std::string> lines;
  if (dumps.empty()) return lines;
  // Each group (by name and members), with each dumping rank's record of it.
  struct Seen {
    const FlightGroup* any = nullptr;
    std::map<int, const FlightGroup*> by_rank;
  };
  std::map<std::string, Seen> groups;
  for (const auto& d : dumps) {
    for (const auto& g : d.groups) {
      std::string key = g.name + "|";
      for (int r : g.ranks) key += std::to_string(r) + ",";
      auto& seen = groups[key];
      seen.any = &g;
      seen.by_rank[d.rank] = &g;
    }
  }
  std::set<int> dumped;
  for (const auto& d : dumps) dumped.insert(d.rank);
  std::set<int> missing_named;
  for (const auto& [key, seen] : groups) {
    const FlightGroup& g = *seen.any;
    // Collectives: who did not reach the last one any member issued, and who disagrees where.
    std::map<int, uint64_t> last;  // rank -> last collective issued
    std::map<uint64_t, std::map<std::string, std::vector<int>>> calls;  // seq -> op -> ranks
    for (const auto& [rank, record] : seen.by_rank) {
      uint64_t top = 0;
      for (const auto& op : record->ops) {
        if (op.kind != 'C') continue;
        top = std::max(top, op.seq);
        calls[op.seq][op.op].push_back(rank);
      }
      last[rank] = top;
    }
    uint64_t reached = 0;
    for (const auto& [rank, top] : last) reached = std::max(reached, top);
    for (const auto& [seq, ops] : calls) {
      if (ops.size() < 2) continue;
      std::string text = group_text(g) + ": the ranks disagree at collective #" + std::to_string(seq) + ": ";
      bool first = true;
      for (const auto& [op, ranks] : ops) {
        text += (first ? "" : "; ") + op + " on " + ranks_text(ranks);
        first = false;
      }
      lines.push_back(text);
      break;  // the first disagreement explains the rest
    }
    if (reached > 0) {
      for (const auto& [rank, top] : last) {
        if (top >= reached) continue;
        const uint64_t next = top + 1;
        std::string what;
        auto it = calls.find(next);
        if (it != calls.end() && !it->second.empty()) {
          what = " (" + it->second.begin()->first + ", issued by " + ranks_text(it->second.begin()->second) + ")";
        }
        std::string its_last = "none";
        auto mine = calls.find(top);
        if (top > 0 && mine != calls.end()) {
          for (const auto& [op, ranks] : mine->second) {
            if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) its_last = "#" + std::to_string(top) + ", " + op;
          }
        }
        lines.push_back(group_text(g) + ": rank " + std::to_string(rank) + " did not reach collective #" +
                        std::to_string(next) + what + "; its last was " + its_last);
      }
    }
    for (int r : g.ranks) {
      if (!dumped.count(r) && missing_named.insert(r).second) {
        lines.push_back("rank " + std::to_string(r) + " left no flight record (it exited, or was killed before it could "
                        "write one)");
      }
    }
    // Point-to-point: a message waiting on one side whose partner the other side never posted.
    const auto& by_rank = seen.by_rank;  // a lambda may not capture a structured binding before C++20
    auto last_of = [&](int rank, char kind, int peer) -> std::optional<uint64_t> {
      auto it = by_rank.find(rank);
      if (it == by_rank.end()) return std::nullopt;
      uint64_t top = 0;
      for (const auto& op : it->second->ops) {
        if (op.kind == kind && op.peer == peer) top = std::max(top, op.seq);
      }
      return top;
    };
    for (const auto& [rank, record] : seen.by_rank) {
      for (const auto& op : record->ops) {
        if (op.kind == 'C' || op.state == "done") continue;
        const bool send = op.kind == 'S';
        const auto partner = last_of(op.peer, send ? 'R' : 'S', rank);
        if (!partner) continue;  // the peer left no record: named above
        if (*partner >= op.seq) {
          lines.push_back(group_text(g) + ": rank " + std::to_string(rank) + "'s " + describe(op) +
                          " was posted on both sides and did not complete");
          continue;
        }
        lines.push_back(group_text(g) + ": rank " + std::to_string(rank) + "'s " + describe(op) +
                        (op.state == "failed" ? " failed" : " is still waiting") +
                        (send ? ": rank " + std::to_string(op.peer) + " has not posted that receive (its last receive "
                                "from rank " + std::to_string(rank)
                              : ": rank " + std::to_string(op.peer) + " has not sent it (its last send to rank " +
                                    std::to_string(rank)) +
                        ": " + (*partner ? "#" + std::to_string(*partner) : "none") + ")");
      }
    }
  }
  // Each rank: its last completed operation, and the first it is still in.
  for (const auto& d : dumps) {
    const FlightOp* done = nullptr;
    const FlightOp* waiting = nullptr;
    const FlightGroup* done_group = nullptr;
    const FlightGroup* waiting_group = nullptr;
    for (const auto& g : d.groups) {
      for (const auto& op : g.ops) {
        if (op.state == "done" && (!done || op.done_us > done->done_us)) {
          done = &op;
          done_group = &g;
        }
        if (op.state != "done" && (!waiting || op.issued_us < waiting->issued_us)) {
          waiting = &op;
          waiting_group = &g;
        }
      }
    }
    constexpr size_t kReason = 100;  // the whole error is in the rank's log
    const std::string reason = d.reason.size() > kReason ? d.reason.substr(0, kReason) + "..." : d.reason;
    std::string text = "rank " + std::to_string(d.rank) + " (dumped on " + reason + "): last completed " +
                       (done ? describe(*done) + " on " + group_text(*done_group) : std::string("nothing"));
    if (waiting) text += "; " + waiting->state + ": " + describe(*waiting) + " on " + group_text(*waiting_group);
    lines.push_back(text);
  }
  return lines;
}

bool flight_recorder_armed(const std::string& folder, int rank) {
  struct stat st {};
  return ::stat((folder + "/flight_rank_" + std::to_string(rank) + ".armed").c_str(), &st) == 0;
}

bool flight_dumped_since(const std::string& folder, int rank, int64_t since_ns) {
  struct stat st {};
  if (::stat((folder + "/flight_rank_" + std::to_string(rank) + ".txt").c_str(), &st) != 0) return false;
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec >= since_ns;
}

}  // namespace tandem::launch
