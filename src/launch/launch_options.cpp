#include "launch/launch_options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <random>

#include "tandem/comm/net.h"
#include "tandem/error.h"

namespace tandem::launch {
namespace {

std::string random_run_id() {
  std::random_device device;
  const char* hex = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 12; ++i) id += hex[device() % 16];
  return id;
}

std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  return (t && *t) ? t : "/tmp";
}

// A count on the command line: 1 to 999999 in decimal digits, or 0 when the text is none.
int positive_count(const std::string& text) {
  bool digits = !text.empty() && text.size() < 7;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  return digits ? std::atoi(text.c_str()) : 0;
}

}  // namespace

int resolve_nproc(const std::string& spec, int gpu_count, int cpu_count) {
  if (spec == "gpu") {
    if (gpu_count <= 0) throw Error("--nproc-per-node gpu: no CUDA device is visible");
    return gpu_count;
  }
  if (spec == "cpu") return std::max(cpu_count, 1);
  if (spec == "auto") return gpu_count > 0 ? gpu_count : std::max(cpu_count, 1);
  const int n = positive_count(spec);
  if (n < 1) {
    throw Error("--nproc-per-node '" + spec + "' is not valid: expected a positive number, gpu, cpu or auto");
  }
  return n;
}

std::string find_program(const std::string& program) {
  if (program.empty()) throw Error("no worker program given: tandem run [flags] -- PROGRAM [ARGS]");
  std::string path;
  if (program.find('/') != std::string::npos) {
    path = program;
  } else {
    const char* env_path = std::getenv("PATH");
    std::string dirs = env_path ? env_path : "/usr/bin:/bin";
    size_t start = 0;
    while (start <= dirs.size()) {
      size_t end = dirs.find(':', start);
      std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
      std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
      struct stat st{};
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111) && ::access(candidate.c_str(), X_OK) == 0) {
        path = candidate;
        break;
      }
      if (end == std::string::npos) break;
      start = end + 1;
    }
    if (path.empty()) throw Error("worker program '" + program + "' not found on PATH");
  }
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw Error("worker program '" + program + "' does not exist");
  if (S_ISDIR(st.st_mode)) throw Error("worker program '" + program + "' is a directory");
  // access() alone says yes to root for any file; require an execute bit too.
  if ((st.st_mode & 0111) == 0 || ::access(path.c_str(), X_OK) != 0) throw Error("worker program '" + program + "' is not executable");
  return path;
}

namespace {

// --hosts h1,h2: names or addresses, no slot counts (--nproc-per-node gives those), no repeats.
std::vector<std::string> split_hosts(const std::string& spec) {
  std::vector<std::string> hosts;
  size_t start = 0;
  for (;;) {
    const size_t end = spec.find(',', start);
    std::string host = spec.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (host.empty()) throw Error("--hosts '" + spec + "' is not valid: expected host names separated by commas (h1,h2)");
    for (char c : host) {
      const auto u = static_cast<unsigned char>(c);
      if (c == ':') {
        throw Error("--hosts: '" + host + "' has a slot count; give bare host names, --nproc-per-node sets the ranks per host");
      }
      if (!(std::isalnum(u) || c == '.' || c == '-' || c == '_')) {
        throw Error("--hosts: '" + host + "' is not a host name or IPv4 address");
      }
    }
    for (const auto& seen : hosts) {
      if (seen == host) throw Error("--hosts: '" + host + "' appears twice; each node once");
    }
    hosts.push_back(host);
    if (end == std::string::npos) return hosts;
    start = end + 1;
  }
}

// Note [Launching through mpirun]: one launcher on the first node, mpirun starts every rank.
void resolve_mpi_flags(LaunchOptions& o) {
  if (o.node_rank_given) {
    throw Error("--node-rank is not used with --backend mpi: run tandem once, on the first node, and mpirun starts "
                "every node's ranks (list the nodes with --hosts)");
  }
  if (!o.hosts.empty()) {
    o.host_list = split_hosts(o.hosts);
    const int count = static_cast<int>(o.host_list.size());
    if (o.nnodes_given && o.nnodes != count) {
      throw Error("--nnodes " + std::to_string(o.nnodes) + " does not match the " + std::to_string(count) +
                  " host(s) of --hosts " + o.hosts + " (omit --nnodes: the host count implies it)");
    }
    o.nnodes = count;
    if (o.master_addr.empty()) o.master_addr = o.host_list.front();
  } else if (o.nnodes > 1) {
    throw Error("--nnodes " + std::to_string(o.nnodes) + " with --backend mpi needs --hosts h1,h2,... naming the " +
                std::to_string(o.nnodes) + " nodes mpirun starts ranks on");
  }
}

// --nnodes N or MIN:MAX (torchrun's spelling).
void resolve_nnodes(LaunchOptions& o) {
  auto count = [&](const std::string& text) {
    const int n = positive_count(text);
    if (n < 1) {
      throw Error("--nnodes " + o.nnodes_spec + " is not valid: expected a positive number, or MIN:MAX for an elastic job");
    }
    return n;
  };
  const size_t colon = o.nnodes_spec.find(':');
  if (colon == std::string::npos) {
    o.nnodes = count(o.nnodes_spec);
    return;
  }
  o.elastic = true;
  o.rdzv.min_nodes = count(o.nnodes_spec.substr(0, colon));
  o.rdzv.max_nodes = count(o.nnodes_spec.substr(colon + 1));
  if (o.rdzv.min_nodes > o.rdzv.max_nodes) {
    throw Error("--nnodes " + o.nnodes_spec + " is not valid: MIN (" + std::to_string(o.rdzv.min_nodes) +
                ") is more than MAX (" + std::to_string(o.rdzv.max_nodes) + ")");
  }
  o.nnodes = o.rdzv.max_nodes;
}

// --rdzv-conf last_call_timeout=30,join_timeout=600: torchrun's keys, in seconds.
void resolve_rdzv_conf(LaunchOptions& o) {
  if (!o.rdzv_conf.empty() && !o.elastic) {
    throw Error("--rdzv-conf is for an elastic job: give --nnodes MIN:MAX");
  }
  size_t start = 0;
  while (start < o.rdzv_conf.size()) {
    size_t end = o.rdzv_conf.find(',', start);
    if (end == std::string::npos) end = o.rdzv_conf.size();
    const std::string item = o.rdzv_conf.substr(start, end - start);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    char* stop = nullptr;
    const double seconds = value.empty() ? -1 : std::strtod(value.c_str(), &stop);
    if (!(seconds >= 0 && seconds <= 86400 && stop && *stop == '\0')) {
      throw Error("--rdzv-conf '" + item + "' is not valid: expected last_call_timeout=SECONDS or join_timeout=SECONDS");
    }
    const auto ms = std::chrono::milliseconds(static_cast<long>(seconds * 1000));
    if (key == "last_call_timeout") {
      o.rdzv.last_call = ms;
    } else if (key == "join_timeout") {
      o.rdzv.join_timeout = ms;
    } else {
      throw Error("--rdzv-conf: unknown key '" + key + "' (known: last_call_timeout, join_timeout)");
    }
    start = end + 1;
  }
}

// Note [Elastic rounds]: the rendezvous numbers the nodes and forms the world of each round.
void resolve_elastic_flags(LaunchOptions& o) {
  if (o.node_rank_given) {
    throw Error("--node-rank is not used with --nnodes " + o.nnodes_spec + ": the elastic rendezvous numbers the nodes");
  }
  if (o.backend == "mpi") {
    throw Error("--nnodes " + o.nnodes_spec + " (elastic) needs tandem run's own workers: --backend mpi starts one fixed world");
  }
  if (o.rdzv.max_nodes > 1) {
    if (o.master_addr.empty()) {
      throw Error("--master-addr is required with --nnodes " + o.nnodes_spec +
                  " (the host that serves the elastic rendezvous; the same on every node)");
    }
    if (o.master_port == 0) throw Error("--master-port is required with --nnodes " + o.nnodes_spec + " (the same on every node)");
  }
}

}  // namespace

void resolve_flags(LaunchOptions& o, int gpu_count, int cpu_count) {
  if (o.backend != "auto" && o.backend != "gloo" && o.backend != "mpi") {
    throw Error("--backend '" + o.backend + "' is not valid: expected auto, gloo or mpi");
  }
  if (!o.hosts.empty() && o.backend != "mpi") {
    throw Error("--hosts needs --backend mpi (without it, run tandem on every node with --nnodes and --node-rank)");
  }
  o.nproc = resolve_nproc(o.nproc_per_node, gpu_count, cpu_count);
  resolve_nnodes(o);
  resolve_rdzv_conf(o);
  if (o.elastic) resolve_elastic_flags(o);
  if (o.backend == "mpi") resolve_mpi_flags(o);
  if (o.nnodes < 1) throw Error("--nnodes " + std::to_string(o.nnodes) + " is not valid: expected a positive number");
  if (!o.elastic && (o.node_rank < 0 || o.node_rank >= o.nnodes)) {
    throw Error("--node-rank " + std::to_string(o.node_rank) + " is not valid: expected 0.." +
                std::to_string(o.nnodes - 1) + " for --nnodes " + std::to_string(o.nnodes));
  }
  if (o.max_restarts < 0) throw Error("--max-restarts must be >= 0");
  if (o.grace_period.count() < 0) throw Error("--grace-period must be >= 0");
  if (o.master_port < 0 || o.master_port > 65535) {
    throw Error("--master-port " + std::to_string(o.master_port) + " is not valid: expected 1..65535");
  }
  if (o.nnodes > 1 && o.backend != "mpi" && !o.elastic) {  // with mpi: the first host, and a free port picked there
    if (o.master_addr.empty()) throw Error("--master-addr is required when --nnodes > 1 (the host of node 0)");
    if (o.master_port == 0) throw Error("--master-port is required when --nnodes > 1 (the same on every node)");
  }
  if (o.master_addr.empty()) o.master_addr = "127.0.0.1";
}

std::string find_mpirun() {
  try {
    return find_program("mpirun");
  } catch (const Error&) {
    throw Error(kNoMpirunMessage);
  }
}

void resolve(LaunchOptions& o, int gpu_count, int cpu_count) {
  resolve_flags(o, gpu_count, cpu_count);
  if (o.backend == "mpi") o.mpirun_path = find_mpirun();
  o.program_path = find_program(o.command.empty() ? std::string() : o.command.front());

  // Node 0 hosts the store: find out now, before any worker starts, whether its port is free.
  // (An elastic node serves the rendezvous only if the port is free here; else it connects.)
  if (o.elastic && o.master_port == 0) o.master_port = comm::pick_free_port(o.master_addr);
  if (o.node_rank == 0 && !o.elastic) {
    const bool local = o.nnodes == 1 && comm::is_loopback(o.master_addr);
    const std::string bind = local ? (o.master_addr == "localhost" ? "127.0.0.1" : o.master_addr) : "";
    if (o.master_port == 0) {
      o.master_port = comm::pick_free_port(local ? bind : "0.0.0.0");
    } else if (!comm::port_is_free(bind, o.master_port)) {
      throw Error("--master-port " + std::to_string(o.master_port) + " is busy on " +
                  (bind.empty() ? std::string("this host") : bind) +
                  ": another process holds it; choose another port" +
                  (o.nnodes == 1 ? " or omit --master-port to pick a free one" : ""));
    }
  }
  if (o.run_id.find_first_of("\t\r\n") != std::string::npos) throw Error("--run-id must not hold a tab or a line break");
  if (o.run_id.empty()) {
    o.run_id = o.nnodes == 1 && !o.elastic ? random_run_id() : o.master_addr + ":" + std::to_string(o.master_port);
  }
  if (o.log_dir.empty()) {
    std::string safe = o.run_id;
    for (char& c : safe) c = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
    o.log_dir = temp_dir() + "/tandem-" + safe;
  }
}

}  // namespace tandem::launch
