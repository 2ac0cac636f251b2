#include "tandem/comm/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "tandem/error.h"

namespace tandem::comm {
namespace {

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() { if (list) freeaddrinfo(list); }
};

AddrInfo resolve(const std::string& host, int port, int socktype, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  AddrInfo info;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &info.list);
  if (rc != 0) throw Error("cannot resolve host '" + host + "': " + gai_strerror(rc));
  return info;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { if (fd_ >= 0) ::close(fd_); }
  int get() const { return fd_; }
  int release() { int f = fd_; fd_ = -1; return f; }
 private:
  int fd_;
};

}  // namespace

std::string busy_port_message(const std::string& where) {
  return "port " + where + " is busy. If another job holds it, choose another --master-port / "
         "MASTER_PORT (or omit it on one node to pick a free one). If a launcher already serves "
         "the rendezvous store there (torchrun does, and says so with "
         "TORCHELASTIC_USE_AGENT_STORE=True), connect to it: set TORCHELASTIC_USE_AGENT_STORE=True "
         "for workers started by hand next to a running store";
}

std::string unresolvable(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (list) freeaddrinfo(list);
  return rc == EAI_NONAME || rc == EAI_FAIL || rc == EAI_NODATA ? gai_strerror(rc) : "";
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

namespace {

// A listening socket on host:port, or -1 with the errno of the last address tried.
int try_listen(const std::string& host, int port, int& last_errno) {
  AddrInfo info = resolve(host, port, SOCK_STREAM, true);
  last_errno = 0;
  for (addrinfo* a = info.list; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) { last_errno = errno; continue; }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), 1024) == 0) {
      return fd.release();
    }
    last_errno = errno;
  }
  return -1;
}

}  // namespace

int listen_on(const std::string& host, int port) {
  int last_errno = 0;
  const int fd = try_listen(host, port, last_errno);
  if (fd >= 0) return fd;
  const std::string where = host + ":" + std::to_string(port);
  if (last_errno == EADDRINUSE) throw Error(busy_port_message(where));
  if (last_errno == EADDRNOTAVAIL) {
    throw Error("cannot listen on " + where + ": '" + host + "' is not an address of this machine");
  }
  throw Error("cannot listen on " + where + ": " + std::strerror(last_errno));
}

int listen_if_free_here(const std::string& host, int port) {
  int last_errno = 0;
  const int fd = try_listen(host, port, last_errno);
  if (fd >= 0 || last_errno == EADDRINUSE || last_errno == EADDRNOTAVAIL) return fd;
  throw Error("cannot listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(last_errno));
}

int connect_to(const std::string& host, int port, std::chrono::milliseconds timeout) {
  AddrInfo info = resolve(host, port, SOCK_STREAM, false);
  std::string why = "no address";
  for (addrinfo* a = info.list; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (fd.get() < 0) { why = std::strerror(errno); continue; }
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 1 && ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        rc = 0;
      } else {
        why = rc == 0 ? "timed out" : std::strerror(err ? err : errno);
        continue;
      }
    } else if (rc != 0) {
      why = std::strerror(errno);
      continue;
    }
    const int flags = ::fcntl(fd.get(), F_GETFL);
    ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
    return fd.release();
  }
  throw Error("cannot connect to " + host + ":" + std::to_string(port) + ": " + why);
}

namespace {

// Where the kernel's ephemeral range starts: the ports it hands out by itself (to connect() and
// to bind(port 0)) are from there up.
int ephemeral_ports_start() {
  int low = 32768;  // Linux's default
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int a = 0;
    if (std::fscanf(f, "%d", &a) == 1 && a > 0) low = a;
    std::fclose(f);
  }
  return low;
}

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw Error(std::string("getsockname failed: ") + std::strerror(errno));
  }
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace

// Note [Free port]
// The port is released here and bound again by rank 0 a second later, after LibTorch has loaded.
// A port from the kernel's ephemeral range can be taken in between by any process's outgoing
// connection or bind(port 0) — Open MPI alone opens dozens — so the port is drawn at random below
// that range (20000 and up, torchrun's default 29500 area left out), where only an explicit bind
// can take it. Only when the ephemeral range leaves no such room does the kernel choose.
int pick_free_port(const std::string& host) {
  const int below = ephemeral_ports_start();
  constexpr int kLowest = 20000, kTorchrunLow = 29400, kTorchrunHigh = 29600;
  if (below - kLowest >= 2000) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> draw(kLowest, below - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = draw(rng);
      if (port >= kTorchrunLow && port < kTorchrunHigh) continue;
      try {
        Fd fd(listen_on(host, port));
        return port;
      } catch (const Error&) {
        // taken (or not bindable here): draw again
      }
    }
  }
  Fd fd(listen_on(host, 0));
  return bound_port(fd.get());
}

bool port_is_free(const std::string& host, int port) {
  try {
    Fd fd(listen_on(host, port));
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string local_address_towards(const std::string& host) {
  AddrInfo info = resolve(host, 9, SOCK_DGRAM, false);
  for (addrinfo* a = info.list; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    // connect() on a datagram socket only picks the route and source address.
    if (fd.get() < 0 || ::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* src = local.ss_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (inet_ntop(local.ss_family, src, text, sizeof(text))) return text;
  }
  throw Error("no route from this machine to MASTER_ADDR '" + host + "'");
}

}  // namespace tandem::comm
