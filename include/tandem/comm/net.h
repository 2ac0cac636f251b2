#pragma once
// Small socket helpers shared by the rendezvous (comm) and the launcher (launch).
// Torch-free on purpose: the launcher links none of LibTorch's heavy parts through these.
#include <chrono>
#include <string>

namespace tandem::comm {

/// True for "localhost", 127.0.0.0/8 and ::1.
bool is_loopback(const std::string& host);

/// A TCP socket bound to host:port and listening (SO_REUSEADDR). Throws tandem::Error naming
/// the address when the port is busy or the host is not an address of this machine.
int listen_on(const std::string& host, int port);

/// listen_on, or -1 when the port is taken (EADDRINUSE) or `host` is not an address of this machine
/// (EADDRNOTAVAIL): the elastic launcher whose endpoint this is hosts the rendezvous, the others
/// connect. Throws tandem::Error on any other failure.
int listen_if_free_here(const std::string& host, int port);

/// A connected TCP socket (blocking) to host:port, the connect bounded by `timeout`. Throws
/// tandem::Error with the reason (refused, unreachable, timed out).
int connect_to(const std::string& host, int port, std::chrono::milliseconds timeout);

/// The one-line message for a busy MASTER_PORT on rank 0: what to do when another job holds the
/// port, and when a launcher (torchrun) already serves the store there.
std::string busy_port_message(const std::string& where);

/// A port that was free on `host` a moment ago, drawn below the kernel's ephemeral range so that
/// no outgoing connection can take it before rank 0 binds it (Note [Free port] in net.cpp).
int pick_free_port(const std::string& host = "127.0.0.1");

/// Whether host:port can be bound now. Used to fail early with a clear message.
bool port_is_free(const std::string& host, int port);

/// Why `host` does not resolve, when the resolver says it never will (no such name: a typo, a
/// node name that is no host name); "" when it resolves, or may later (a resolver that is down).
std::string unresolvable(const std::string& host);

/// This machine's address on the route towards `host` (no packet is sent): the interface that
/// Gloo should use to reach rank 0 in a multi-node job.
std::string local_address_towards(const std::string& host);

}  // namespace tandem::comm
