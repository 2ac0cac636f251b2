#include "tandem/comm/rendezvous.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "tandem/comm/net.h"
#include "tandem/error.h"

namespace tandem::comm {
namespace {

const char* kRunIdKey = "tandem/run_id";

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

std::string agent_store_prefix(int restart_count) {
  return "/worker/attempt_" + std::to_string(restart_count);
}

c10::intrusive_ptr<c10d::Store> rendezvous(const World& world, std::chrono::milliseconds timeout) {
  if (world.world_size == 1) return c10::make_intrusive<c10d::HashStore>();

  const std::string where = world.master_addr + ":" + std::to_string(world.master_port);
  const bool hosts_store = world.rank == 0 && !world.use_agent_store;
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(world.master_port);
  options.isServer = hosts_store;
  options.numWorkers = world.world_size;
  options.waitWorkers = true;  // as PyTorch's workers: a client only counts itself in
  options.timeout = timeout;
  // Note [Rendezvous]: loopback-only when the whole job is on this host. We bind the socket
  // ourselves so a busy port is reported as such, then hand it to the store.
  if (hosts_store && world.single_node() && is_loopback(world.master_addr)) {
    options.masterListenFd =
        listen_on(world.master_addr == "localhost" ? "127.0.0.1" : world.master_addr, world.master_port);
  }

  // A name that will never resolve would have every rank retry until the timeout: say so now.
  if (const std::string why = unresolvable(world.master_addr); !why.empty()) {
    throw Error("rendezvous: rank 0's host '" + world.master_addr + "' (" + world.master_addr_from +
                ") does not resolve here: " + why + "; set MASTER_ADDR to rank 0's address");
  }
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, options);
  } catch (const std::exception& e) {
    const std::string text = e.what();
    if (hosts_store && (text.find("Address already in use") != std::string::npos ||
                        text.find("EADDRINUSE") != std::string::npos)) {
      throw Error(busy_port_message(where));
    }
    throw Error("rendezvous of rank " + std::to_string(world.rank) + " at " +
                (world.use_agent_store ? "the launcher's store " : "") + where + " failed within " +
                std::to_string(timeout.count() / 1000) + " s: " + one_line(e));
  }
  // Note [Agent store]: the launcher's store outlives the workers, so a restarted attempt would
  // read the keys its predecessor wrote; each attempt gets its own key space, as PyTorch did.
  if (world.use_agent_store) {
    store = c10::make_intrusive<c10d::PrefixStore>(agent_store_prefix(world.restart_count), store);
  }

  // Rank 0 always publishes its run id, empty when it has none (mpirun, hand-started jobs), and
  // every other rank compares: a worker joins only a run of its own id, and one that has an id
  // never waits for a key that a rank 0 without one would never write.
  if (world.rank == 0) {
    store->set(kRunIdKey, bytes(world.run_id));
  } else {
    std::vector<uint8_t> theirs;
    try {
      theirs = store->get(kRunIdKey);
    } catch (const std::exception& e) {
      throw Error("rendezvous at " + where + ": rank 0 did not publish its run id: " + one_line(e));
    }
    const std::string other(theirs.begin(), theirs.end());
    if (other != world.run_id) {
      auto run = [](const std::string& id) { return id.empty() ? std::string("no run id") : "run '" + id + "'"; };
      throw Error("refusing to join: this worker has " + run(world.run_id) + " but the store at " + where +
                  " serves " + run(other) + " (check TORCHELASTIC_RUN_ID / --run-id)");
    }
  }
  return store;
}

}  // namespace tandem::comm
