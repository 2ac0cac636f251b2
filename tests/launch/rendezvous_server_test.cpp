// The elastic rendezvous server over loopback: it reads the numbers of a request as strictly as
// the client reads those of an answer (one parser, elastic_protocol.h), and refuses a malformed
// one as it refuses any other bad line: it hangs up.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "launch/elastic_protocol.h"
#include "launch/rendezvous_server.h"
#include "tandem/comm/net.h"

using namespace tandem::launch;
using namespace std::chrono_literals;

namespace {

// A server for run "run" (--nnodes 1:2, --max-restarts 0) on a loopback port of its own.
struct Served {
  int port = 0;
  std::unique_ptr<RendezvousServer> server;
  Served() {
    const int fd = tandem::comm::listen_on("127.0.0.1", 0);
    sockaddr_in address{};
    socklen_t length = sizeof address;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    port = ntohs(address.sin_port);
    server = std::make_unique<RendezvousServer>(fd, ElasticConfig{1, 2, 2000ms, 60000ms, 15000ms, 0}, "run", "1:2");
  }
};

// A node's launcher, as the server sees it: one connection that said hello.
class Peer {
 public:
  explicit Peer(int port) : fd_(tandem::comm::connect_to("127.0.0.1", port, 5s)) {
    EXPECT_EQ(ask({"HELLO", kElasticProtocol, "run", "1:2", "0"}).rfind("OK\t", 0), 0u);
  }
  ~Peer() { ::close(fd_); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  /// The answer line, without its newline; "(hung up)" when the server closed the connection.
  std::string ask(const std::vector<std::string>& fields) {
    const std::string line = encode_fields(fields);
    EXPECT_EQ(::send(fd_, line.data(), line.size(), MSG_NOSIGNAL), static_cast<ssize_t>(line.size()));
    std::string buffer;
    for (;;) {
      const size_t end = buffer.find('\n');
      if (end != std::string::npos) return buffer.substr(0, end);
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return "(no answer within 5 s)";
      char chunk[512];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return "(hung up)";
      buffer.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
};

}  // namespace

TEST(RendezvousServer, RefusesAJoinWhoseNumbersAreMalformed) {
  Served served;
  const std::vector<std::pair<std::string, std::string>> malformed = {
      {"2x", "29500"}, {"2", "29500abc"}, {"", "29500"}, {"2", ""}, {"0x2", "29500"}, {"2", "99999999999"}};
  for (const auto& [nproc, port] : malformed) {
    Peer peer(served.port);
    EXPECT_EQ(peer.ask({"JOIN", nproc, "10.0.0.1", port, "1", ""}), "(hung up)") << "nproc '" << nproc << "', port '"
                                                                                  << port << "'";
  }
  Peer peer(served.port);
  EXPECT_EQ(peer.ask({"JOIN", "2", "10.0.0.1", "29500", "1", ""}), "OK\t0");
}
