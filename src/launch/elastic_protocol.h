#pragma once
// The wire format between the launchers of an elastic job and the one that serves the rendezvous
// (Note [Elastic rounds]): one line per request and per answer, fields separated by tabs, over a
// plain TCP connection that stays open for the whole job (its closing tells the server the node
// is gone). Requests:
//   HELLO <protocol> <run id> <--nnodes spec> <--max-restarts>
//                                               -> OK <node id> | ERR <one line> (and hang up)
//   JOIN <nproc> <addr> <port> <hosts server> <failure, or empty>
//                                               -> OK <1 when it counted as one of the job's restarts>
//   POLL                                        -> WAIT | GO <round> <node rank> <nnodes> <world>
//                                                  <rank offset> <master addr> <master port>
//                                                  | RESTART <why> | FAILED <why> | FINISHED
//   DONE                                        -> OK
#include <optional>
#include <string>
#include <vector>

#include "launch/elastic_rounds.h"

namespace tandem::launch {

constexpr const char* kElasticProtocol = "tandem-elastic-1";
constexpr size_t kMaxElasticLine = 4096;

/// Fields joined by tabs, ending in a newline. Throws tandem::Error on a field that holds a tab
/// or a line break.
std::string encode_fields(const std::vector<std::string>& fields);
/// `text` fit to be a field: tabs and line breaks (any control character) become spaces.
std::string field_safe(std::string text);
/// A line (without its newline) split at tabs.
std::vector<std::string> split_fields(const std::string& line);
/// A number of a request or an answer (a count, a rank, a port): decimal, 0 to 2^30, nothing
/// after it; nullopt for anything else ("2x", "", "-1"). Both ends read every number with it.
std::optional<int> decode_count(const std::string& field);

std::vector<std::string> encode_answer(const PollAnswer& answer);
/// Throws tandem::Error when the fields are no answer.
PollAnswer decode_answer(const std::vector<std::string>& fields);

}  // namespace tandem::launch
