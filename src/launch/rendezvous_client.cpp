#include "launch/rendezvous_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "launch/elastic_protocol.h"
#include "tandem/comm/net.h"
#include "tandem/error.h"

namespace tandem::launch {
namespace {

// How long one answer may take: the server answers at once, so this is a dead or cut-off node.
constexpr std::chrono::seconds kAnswerTimeout{10};

}  // namespace

RendezvousClient::RendezvousClient(const std::string& host, int port, const std::string& run_id,
                                   const std::string& nnodes_spec, int max_restarts,
                                   std::chrono::milliseconds patience, const std::function<bool()>& stop)
    : where_(host + ":" + std::to_string(port)) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  std::string why;
  for (;;) {
    try {
      fd_ = comm::connect_to(host, port, std::chrono::seconds(5));
      break;
    } catch (const Error& e) {
      why = e.what();
    }
    if (stop()) throw Error("stopped while connecting to the elastic rendezvous at " + where_);
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error("cannot reach the elastic rendezvous at " + where_ + " within " +
                  std::to_string(patience.count() / 1000) + " s (join_timeout): " + why);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  const auto answer = request({"HELLO", kElasticProtocol, run_id, nnodes_spec, std::to_string(max_restarts)});
  if (answer.size() == 2 && answer[0] == "ERR") throw Error(answer[1]);
  if (answer.size() != 2 || answer[0] != "OK") {
    throw Error("the elastic rendezvous at " + where_ + " answered something unexpected");
  }
}

RendezvousClient::~RendezvousClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> RendezvousClient::request(const std::vector<std::string>& fields) {
  const std::string line = encode_fields(fields);
  auto gone = [&](const std::string& what) {
    return Error("the elastic rendezvous at " + where_ + " " + what +
                 (fields[0] == "HELLO" ? "" : " (the launcher serving it, on the --master-addr node, stopped or cannot be reached)"));
  };
  for (size_t sent = 0; sent < line.size();) {
    const ssize_t n = ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw gone("closed the connection");
    sent += static_cast<size_t>(n);
  }
  const auto deadline = std::chrono::steady_clock::now() + kAnswerTimeout;
  for (;;) {
    const size_t end = buffer_.find('\n');
    if (end != std::string::npos) {
      const std::string answer = buffer_.substr(0, end);
      buffer_.erase(0, end + 1);
      return split_fields(answer);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw gone("did not answer within 10 s");
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw gone(fields[0] == "HELLO" ? "hung up on this node's hello (is it a Tandem elastic rendezvous?)"
                                      : "closed the connection");
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    if (buffer_.size() > kMaxElasticLine) throw gone("sent a line too long");
  }
}

bool RendezvousClient::join(const NodeOffer& offer, const std::string& failure) {
  const auto answer = request({"JOIN", std::to_string(offer.nproc), offer.addr, std::to_string(offer.port),
                               offer.hosts_server ? "1" : "0", field_safe(failure)});
  if (answer.size() != 2 || answer[0] != "OK") throw Error("the elastic rendezvous at " + where_ + " refused to join");
  return answer[1] == "1";
}

PollAnswer RendezvousClient::poll() { return decode_answer(request({"POLL"})); }

void RendezvousClient::done() { request({"DONE"}); }

}  // namespace tandem::launch
