#include "launch/rendezvous_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <map>
#include <optional>

#include "launch/elastic_protocol.h"

namespace tandem::launch {

namespace {

// How long a connection may stay without saying HELLO.
constexpr std::chrono::seconds kHelloTimeout{10};

}  // namespace

struct RendezvousServer::Connection {
  int node = -1;  // set by HELLO
  std::string buffer;
  ElasticRounds::Clock::time_point accepted;
};

RendezvousServer::RendezvousServer(int listen_fd, ElasticConfig config, std::string run_id, std::string nnodes_spec)
    : listen_fd_(listen_fd),
      run_id_(std::move(run_id)),
      nnodes_spec_(std::move(nnodes_spec)),
      max_restarts_(config.max_restarts),
      rounds_(config, ElasticRounds::Clock::now()) {
  (void)!::pipe2(wake_, O_CLOEXEC | O_NONBLOCK);
  thread_ = std::thread([this] { serve(); });
}

RendezvousServer::~RendezvousServer() {
  stop_ = true;
  (void)!::write(wake_[1], "x", 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

int RendezvousServer::nodes_connected() {
  std::lock_guard<std::mutex> lock(mutex_);
  return rounds_.connected();
}

std::string RendezvousServer::answer(Connection& c, const std::string& line, bool& close) {
  const auto now = ElasticRounds::Clock::now();
  // Whatever a peer sends, an answer that echoes a field stays one line.
  auto f = split_fields(line);
  for (auto& field : f) field = field_safe(std::move(field));
  const std::string& op = f[0];
  std::lock_guard<std::mutex> lock(mutex_);
  if (c.node < 0) {
    if (op != "HELLO" || f.size() != 5) return "";  // not one of ours: hang up
    close = true;
    if (f[1] != kElasticProtocol) {
      return encode_fields({"ERR", "the rendezvous speaks " + std::string(kElasticProtocol) + ", this node " + f[1] +
                                       ": run the same Tandem on every node"});
    }
    if (f[2] != run_id_) {
      return encode_fields({"ERR", "refusing to join: this node is for run '" + f[2] + "' but the rendezvous serves run '" +
                                       run_id_ + "' (give every node the same --run-id)"});
    }
    if (f[3] != nnodes_spec_) {
      return encode_fields({"ERR", "refusing to join: this node was started with --nnodes " + f[3] +
                                       " but the run has --nnodes " + nnodes_spec_});
    }
    if (f[4] != std::to_string(max_restarts_)) {
      return encode_fields({"ERR", "refusing to join: this node was started with --max-restarts " + f[4] +
                                       " but the run has --max-restarts " + std::to_string(max_restarts_)});
    }
    close = false;
    c.node = rounds_.connect(now);
    return encode_fields({"OK", std::to_string(c.node)});
  }
  rounds_.seen(c.node, now);
  if (op == "JOIN" && f.size() == 6) {
    // Read as strictly as the client reads an answer: "2x" is no count.
    const std::optional<int> nproc = decode_count(f[1]), port = decode_count(f[3]);
    if (!nproc || !port) return "";
    NodeOffer offer;
    offer.nproc = *nproc;
    offer.addr = f[2];
    offer.port = *port;
    offer.hosts_server = f[4] == "1";
    if (offer.nproc < 1 || offer.port < 1 || offer.port > 65535 || offer.addr.empty()) return "";
    return encode_fields({"OK", rounds_.join(c.node, offer, f[5], now) ? "1" : "0"});
  }
  if (op == "POLL" && f.size() == 1) return encode_fields(encode_answer(rounds_.poll(c.node, now)));
  if (op == "DONE" && f.size() == 1) {
    rounds_.done(c.node);
    return encode_fields({"OK"});
  }
  return "";
}

void RendezvousServer::serve() {
  // Signals are the launcher's main thread's business (its self-pipe).
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  std::map<int, Connection> connections;
  auto drop = [&](int fd) {
    auto it = connections.find(fd);
    if (it == connections.end()) return;
    if (it->second.node >= 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      rounds_.disconnect(it->second.node);
    }
    ::close(fd);
    connections.erase(it);
  };
  while (!stop_) {
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const auto& [fd, c] : connections) fds.push_back({fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 200);
    if (fds[1].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) connections[fd].accepted = ElasticRounds::Clock::now();
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int fd = fds[i].fd;
      Connection& c = connections[fd];
      char chunk[4096];
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
      if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) drop(fd);
        continue;
      }
      c.buffer.append(chunk, static_cast<size_t>(n));
      bool keep = true;
      for (size_t end; keep && (end = c.buffer.find('\n')) != std::string::npos;) {
        const std::string line = c.buffer.substr(0, end);
        c.buffer.erase(0, end + 1);
        bool close = false;
        std::string reply;
        try {
          reply = answer(c, line, close);
        } catch (const std::exception&) {
          reply.clear();  // a request it cannot answer: hang up on it, never on the job
        }
        // Answers are one short line to a client that waits for it: one that would block is a
        // peer that does not read, and is dropped rather than stall the rendezvous.
        keep = !reply.empty() && !close &&
               ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(reply.size());
        if (close) (void)!::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      if (!keep || c.buffer.size() > kMaxElasticLine) drop(fd);
    }
    // A node that stopped asking (a hung launcher, a network cut without a reset) is gone too.
    std::vector<int> silent;
    const auto now = ElasticRounds::Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      silent = rounds_.expired(now);
    }
    std::vector<int> mute;  // connected, never said HELLO
    for (const auto& [fd, c] : connections) {
      if (c.node < 0 && now - c.accepted >= kHelloTimeout) mute.push_back(fd);
    }
    for (int fd : mute) drop(fd);
    for (int node : silent) {
      for (const auto& [fd, c] : connections) {
        if (c.node == node) {
          drop(fd);
          break;
        }
      }
    }
  }
  for (const auto& [fd, c] : connections) ::close(fd);
}

}  // namespace tandem::launch
