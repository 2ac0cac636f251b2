#include "tandem/comm/world.h"

#include <cstdlib>
#include <sstream>

#include "tandem/error.h"

namespace tandem::comm {
namespace {

// A strict decimal parser: the whole value must be digits (no sign, spaces or suffix), so
// `RANK=1x` or `RANK=-1` is an error rather than a silent 1 or a wrap-around.
int parse_int(const std::string& name, const std::string& value, long min, long max,
              const char* expected) {
  bool digits = !value.empty() && value.size() <= 10;
  for (char c : value) digits = digits && c >= '0' && c <= '9';
  long parsed = digits ? std::strtol(value.c_str(), nullptr, 10) : -1;
  if (!digits || parsed < min || parsed > max) {
    throw Error(name + "=\"" + value + "\" is not valid: expected " + expected);
  }
  return static_cast<int>(parsed);
}

class Reader {
 public:
  explicit Reader(const World::Lookup& lookup) : lookup_(lookup) {}

  bool has(const std::string& name) const { return lookup_(name).has_value(); }

  std::optional<int> count(const std::string& name) const {  // >= 1
    auto v = lookup_(name);
    if (!v) return std::nullopt;
    return parse_int(name, *v, 1, 1 << 24, "a positive integer (e.g. 4)");
  }
  std::optional<int> index(const std::string& name) const {  // >= 0
    auto v = lookup_(name);
    if (!v) return std::nullopt;
    return parse_int(name, *v, 0, 1 << 24, "a non-negative integer (e.g. 0)");
  }
  std::optional<std::string> text(const std::string& name) const {
    auto v = lookup_(name);
    if (v && v->empty()) throw Error(name + " is set but empty");
    return v;
  }

 private:
  const World::Lookup& lookup_;
};

// Slurm writes SLURM_NTASKS_PER_NODE as "4" or "4(x2)" or "4,2": the leading count is ours.
std::optional<int> leading_count(const std::optional<std::string>& v) {
  if (!v || v->empty() || (*v)[0] < '0' || (*v)[0] > '9') return std::nullopt;
  return std::atoi(v->c_str());
}

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}

}  // namespace

const char* to_string(WorldSource source) {
  switch (source) {
    case WorldSource::Single: return "single process (no launcher variables)";
    case WorldSource::Torchrun: return "torchrun / tandem run";
    case WorldSource::Slurm: return "Slurm";
    case WorldSource::OpenMpi: return "Open MPI";
  }
  return "?";
}

World World::from_env() {
  return from_lookup([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

World World::from_lookup(const Lookup& lookup) {
  Reader env(lookup);
  World w;
  if (env.has("RANK") || env.has("WORLD_SIZE")) {
    w.source = WorldSource::Torchrun;
    require(env.has("RANK"), "WORLD_SIZE is set but RANK is not: set both (e.g. RANK=0 WORLD_SIZE=2)");
    require(env.has("WORLD_SIZE"), "RANK is set but WORLD_SIZE is not: set both (e.g. RANK=0 WORLD_SIZE=2)");
    w.rank = *env.index("RANK");
    w.world_size = *env.count("WORLD_SIZE");
    // Without LOCAL_* the job is taken to be on one host, as a hand-started job usually is.
    w.local_rank = env.index("LOCAL_RANK").value_or(w.rank);
    w.local_world_size = env.count("LOCAL_WORLD_SIZE").value_or(w.world_size);
    w.group_rank = env.index("GROUP_RANK").value_or(w.rank / w.local_world_size);
  } else if (env.has("SLURM_PROCID")) {
    w.source = WorldSource::Slurm;
    w.rank = *env.index("SLURM_PROCID");
    w.world_size = env.count("SLURM_NTASKS").value_or(1);
    w.local_rank = env.index("SLURM_LOCALID").value_or(0);
    int nodes = env.count("SLURM_NNODES").value_or(1);
    w.local_world_size = leading_count(lookup("SLURM_NTASKS_PER_NODE"))
                             .value_or((w.world_size + nodes - 1) / nodes);
    w.group_rank = env.index("SLURM_NODEID").value_or(w.rank / w.local_world_size);
  } else if (env.has("OMPI_COMM_WORLD_RANK")) {
    w.source = WorldSource::OpenMpi;
    w.rank = *env.index("OMPI_COMM_WORLD_RANK");
    w.world_size = env.count("OMPI_COMM_WORLD_SIZE").value_or(1);
    w.local_rank = env.index("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    w.local_world_size = env.count("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(w.world_size);
    w.group_rank = w.rank / w.local_world_size;
  }

  const std::string rank_name = w.source == WorldSource::Slurm     ? "SLURM_PROCID"
                                : w.source == WorldSource::OpenMpi ? "OMPI_COMM_WORLD_RANK"
                                                                   : "RANK";
  const std::string local_name = w.source == WorldSource::Slurm     ? "SLURM_LOCALID"
                                 : w.source == WorldSource::OpenMpi ? "OMPI_COMM_WORLD_LOCAL_RANK"
                                                                    : "LOCAL_RANK";
  require(w.rank < w.world_size, rank_name + "=" + std::to_string(w.rank) +
                                     " must be less than the world size " +
                                     std::to_string(w.world_size));
  require(w.local_world_size <= w.world_size,
          "LOCAL_WORLD_SIZE=" + std::to_string(w.local_world_size) +
              " must not exceed WORLD_SIZE=" + std::to_string(w.world_size));
  require(w.local_rank < w.local_world_size,
          local_name + "=" + std::to_string(w.local_rank) +
              " must be less than the local world size " + std::to_string(w.local_world_size));

  if (auto addr = env.text("MASTER_ADDR")) w.master_addr = *addr;
  if (auto port = lookup("MASTER_PORT")) {
    w.master_port = parse_int("MASTER_PORT", *port, 1, 65535, "a TCP port number in 1..65535");
  }
  if (w.world_size > 1) {
    require(!w.master_addr.empty(),
            "MASTER_ADDR is not set: a world of " + std::to_string(w.world_size) +
                " ranks needs the host of rank 0 (e.g. MASTER_ADDR=127.0.0.1)");
    require(w.master_port != 0, "MASTER_PORT is not set: a world of " +
                                    std::to_string(w.world_size) +
                                    " ranks needs rank 0's store port (e.g. MASTER_PORT=29500)");
  }
  w.restart_count = env.index("TORCHELASTIC_RESTART_COUNT").value_or(0);
  w.max_restarts = env.index("TORCHELASTIC_MAX_RESTARTS").value_or(0);
  if (auto id = lookup("TORCHELASTIC_RUN_ID")) w.run_id = *id;
  return w;
}

c10::Device World::device(bool use_cuda) const {
  if (!use_cuda) return c10::Device(c10::DeviceType::CPU);
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(local_rank));
}

std::string World::describe() const {
  std::ostringstream out;
  out << "rank " << rank << "/" << world_size << " (local " << local_rank << "/"
      << local_world_size << ", node " << group_rank << ")";
  if (!master_addr.empty()) out << " master " << master_addr << ":" << master_port;
  if (!run_id.empty()) out << " run " << run_id;
  out << " restart " << restart_count << "/" << max_restarts << " via " << to_string(source);
  return out.str();
}

}  // namespace tandem::comm
