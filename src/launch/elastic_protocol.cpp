#include "launch/elastic_protocol.h"

#include <cstdlib>

#include "tandem/error.h"

namespace tandem::launch {

std::string encode_fields(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].find_first_of("\t\r\n") != std::string::npos) {
      throw Error("elastic rendezvous: '" + fields[i] + "' holds a tab or a line break");
    }
    line += (i ? "\t" : "") + fields[i];
  }
  return line + "\n";
}

std::string field_safe(std::string text) {
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return text;
}

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    fields.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return fields;
    start = tab + 1;
  }
}

std::vector<std::string> encode_answer(const PollAnswer& answer) {
  using Kind = PollAnswer::Kind;
  switch (answer.kind) {
    case Kind::Wait: return {"WAIT"};
    case Kind::Restart: return {"RESTART", answer.why};
    case Kind::Failed: return {"FAILED", answer.why};
    case Kind::Finished: return {"FINISHED"};
    case Kind::Go: {
      const Assignment& a = answer.assignment;
      return {"GO", std::to_string(a.round), std::to_string(a.node_rank), std::to_string(a.nnodes),
              std::to_string(a.world_size), std::to_string(a.rank_offset), a.master_addr,
              std::to_string(a.master_port)};
    }
  }
  return {"WAIT"};
}

std::optional<int> decode_count(const std::string& field) {
  char* end = nullptr;
  const long v = std::strtol(field.c_str(), &end, 10);
  if (field.empty() || *end || v < 0 || v > 1 << 30) return std::nullopt;
  return static_cast<int>(v);
}

namespace {

int to_int(const std::string& s) {
  const std::optional<int> v = decode_count(s);
  if (!v) throw Error("elastic rendezvous: '" + s + "' is not a count");
  return *v;
}

}  // namespace

PollAnswer decode_answer(const std::vector<std::string>& f) {
  using Kind = PollAnswer::Kind;
  PollAnswer answer;
  const std::string kind = f.empty() ? "" : f[0];
  if (kind == "WAIT" && f.size() == 1) return answer;
  if (kind == "FINISHED" && f.size() == 1) return answer.kind = Kind::Finished, answer;
  if ((kind == "RESTART" || kind == "FAILED") && f.size() == 2) {
    answer.kind = kind == "RESTART" ? Kind::Restart : Kind::Failed;
    answer.why = f[1];
    return answer;
  }
  if (kind == "GO" && f.size() == 8) {
    answer.kind = Kind::Go;
    Assignment& a = answer.assignment;
    a.round = to_int(f[1]);
    a.node_rank = to_int(f[2]);
    a.nnodes = to_int(f[3]);
    a.world_size = to_int(f[4]);
    a.rank_offset = to_int(f[5]);
    a.master_addr = f[6];
    a.master_port = to_int(f[7]);
    return answer;
  }
  throw Error("elastic rendezvous: unexpected answer '" + (f.empty() ? std::string() : f[0]) + "'");
}

}  // namespace tandem::launch
