#include "tandem/comm/world.h"

#include <cstdlib>
#include <limits>
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

// Slurm writes task counts as "4", "4(x2)" or "4,2": the leading count is ours. Strict like the
// rest: it must start with a positive count and go on with nothing but "(" or ",".
std::optional<int> leading_count(const std::string& name, const std::optional<std::string>& v) {
  if (!v) return std::nullopt;
  const char* expected = "a task count such as 4, 4(x2) or 4,2";
  try {
    return parse_int(name, v->substr(0, v->find_first_of("(,")), 1, 1 << 24, expected);
  } catch (const Error&) {
    throw Error(name + "=\"" + *v + "\" is not valid: expected " + expected);
  }
}

// Note [Slurm's rank 0]
// Under srun the tasks have Slurm's variables and nothing else: no launcher of ours chose a host
// and a port for the rendezvous. Every task must derive the same pair by itself:
// - the host: the first node of the step (SLURM_STEP_NODELIST), where Slurm's block and cyclic
//   distributions place task 0 (not so with --distribution=arbitrary, SLURM_HOSTFILE or plane
//   layouts that start elsewhere: set MASTER_ADDR there). Only a step has one: a batch script
//   itself (sbatch without srun) is no step, and its "tasks" are not started, so there a world
//   of several still needs MASTER_ADDR (or srun, or tandem run) instead of waiting for no one.
//   Slurm writes node lists compressed ("gpu[07-09,12],cpu3"); the first host is the first of
//   each bracket ("gpu07"). It is a node name: Slurm sites name nodes by resolvable host names,
//   as Lightning and submitit assume.
// - the port: the first of SLURM_STEP_RESV_PORTS when the step reserved ports (srun
//   --resv-ports), else one drawn from the job and step ids (15000 + (31 job + step) mod 17000,
//   below Linux's ephemeral ports from 32768), so that two steps of one job, or two jobs on a
//   node, do not choose the same port by rule.
// MASTER_ADDR and MASTER_PORT, when set, win (sbatch scripts that export them keep working).
std::string first_slurm_host(const std::string& name, const std::string& list) {
  const std::string invalid = name + "=\"" + list + "\" is not a Slurm node list";
  std::string host;
  for (size_t i = 0; i < list.size() && list[i] != ',';) {
    if (list[i] != '[') {
      host += list[i++];
      continue;
    }
    const size_t close = list.find(']', i);
    TANDEM_CHECK(close != std::string::npos, invalid, " (a '[' without ']')");
    const std::string first = list.substr(i + 1, list.find_first_of("-,]", i + 1) - i - 1);
    TANDEM_CHECK(!first.empty() && first.find_first_not_of("0123456789") == std::string::npos, invalid,
                 " (a range that does not start with a number)");
    host += first;
    i = close + 1;
  }
  TANDEM_CHECK(!host.empty(), invalid, " (it names no node first)");
  return host;
}

int slurm_port(const Reader& env, const World::Lookup& lookup) {
  if (auto ports = lookup("SLURM_STEP_RESV_PORTS")) {
    return parse_int("SLURM_STEP_RESV_PORTS", ports->substr(0, ports->find_first_of("-,")), 1, 65535,
                     "a port range such as 12000-12001");
  }
  auto job = lookup("SLURM_JOB_ID");
  if (!job) return 0;
  const long long id = parse_int("SLURM_JOB_ID", *job, 0, std::numeric_limits<int>::max(), "a job id (e.g. 4711)");
  const long long step = env.index("SLURM_STEP_ID").value_or(0);
  return 15000 + static_cast<int>((31 * id + step) % 17000);
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
  // The variables this source was read from, so that every message names what the user set:
  // `*_from` is "WORLD_SIZE=8" when read, or "the world size 1 (SLURM_NTASKS is not set)".
  std::string rank_name = "RANK", local_rank_name = "LOCAL_RANK";
  std::string size_from, local_size_from;
  auto read_from = [](const std::string& name, int value) { return name + "=" + std::to_string(value); };
  auto defaulted = [](const char* what, int value, const std::string& why) {
    return std::string(what) + " " + std::to_string(value) + " (" + why + ")";
  };
  if (env.has("RANK") || env.has("WORLD_SIZE")) {
    w.source = WorldSource::Torchrun;
    TANDEM_CHECK(env.has("RANK"), "WORLD_SIZE is set but RANK is not: set both (e.g. RANK=0 WORLD_SIZE=2)");
    TANDEM_CHECK(env.has("WORLD_SIZE"), "RANK is set but WORLD_SIZE is not: set both (e.g. RANK=0 WORLD_SIZE=2)");
    w.rank = *env.index("RANK");
    w.world_size = *env.count("WORLD_SIZE");
    size_from = read_from("WORLD_SIZE", w.world_size);
    // Without LOCAL_* the job is taken to be on one host, as a hand-started job usually is.
    w.local_rank = env.index("LOCAL_RANK").value_or(w.rank);
    auto local_size = env.count("LOCAL_WORLD_SIZE");
    w.local_world_size = local_size.value_or(w.world_size);
    local_size_from = local_size ? read_from("LOCAL_WORLD_SIZE", *local_size)
                                 : defaulted("the local world size", w.local_world_size,
                                             "LOCAL_WORLD_SIZE is not set: WORLD_SIZE");
    w.group_rank = env.index("GROUP_RANK").value_or(w.rank / w.local_world_size);
  } else if (env.has("SLURM_PROCID")) {
    w.source = WorldSource::Slurm;
    rank_name = "SLURM_PROCID", local_rank_name = "SLURM_LOCALID";
    w.rank = *env.index("SLURM_PROCID");
    auto size = env.count("SLURM_NTASKS");
    w.world_size = size.value_or(1);
    size_from = size ? read_from("SLURM_NTASKS", *size)
                     : defaulted("the world size", 1, "SLURM_NTASKS is not set");
    w.local_rank = env.index("SLURM_LOCALID").value_or(0);
    const auto nnodes = env.count("SLURM_NNODES");
    const int nodes = nnodes.value_or(1);
    auto per_node = lookup("SLURM_NTASKS_PER_NODE");
    auto local_size = leading_count("SLURM_NTASKS_PER_NODE", per_node);
    w.local_world_size = local_size.value_or((w.world_size + nodes - 1) / nodes);
    local_size_from = local_size ? "SLURM_NTASKS_PER_NODE=" + *per_node
                                 : defaulted("the local world size", w.local_world_size,
                                             "SLURM_NTASKS_PER_NODE is not set: SLURM_NTASKS / SLURM_NNODES");
    w.group_rank = env.index("SLURM_NODEID").value_or(w.rank / w.local_world_size);
    // Note [Threads under srun]
    // torchrun and tandem run give each of several workers on a host OMP_NUM_THREADS=1, so that
    // N processes do not run N OpenMP pools over every core. srun starts the tasks itself and
    // sets no such variable; Slurm's statement of a task's CPUs is SLURM_CPUS_PER_TASK (srun -c).
    // So a task of Slurm's, with OMP_NUM_THREADS unset, uses SLURM_CPUS_PER_TASK threads, or 1
    // when several tasks share its node: what the same job gets under tandem run (and the same
    // bits: the kernels' sums depend on the thread count).
    if (!env.has("OMP_NUM_THREADS")) {
      w.intra_op_threads = env.count("SLURM_CPUS_PER_TASK").value_or(w.local_world_size > 1 ? 1 : 0);
    }
    if (nnodes) {  // Slurm's variables must agree with each other
      TANDEM_CHECK(w.group_rank < nodes, "SLURM_NODEID=", w.group_rank, " must be less than SLURM_NNODES=", nodes);
      TANDEM_CHECK(static_cast<int64_t>(w.local_world_size) * nodes >= w.world_size, local_size_from, " on SLURM_NNODES=",
                   nodes, " node(s) cannot hold ", size_from, " tasks");
    }
  } else if (env.has("OMPI_COMM_WORLD_RANK")) {
    w.source = WorldSource::OpenMpi;
    rank_name = "OMPI_COMM_WORLD_RANK", local_rank_name = "OMPI_COMM_WORLD_LOCAL_RANK";
    w.rank = *env.index("OMPI_COMM_WORLD_RANK");
    auto size = env.count("OMPI_COMM_WORLD_SIZE");
    w.world_size = size.value_or(1);
    size_from = size ? read_from("OMPI_COMM_WORLD_SIZE", *size)
                     : defaulted("the world size", 1, "OMPI_COMM_WORLD_SIZE is not set");
    w.local_rank = env.index("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    auto local_size = env.count("OMPI_COMM_WORLD_LOCAL_SIZE");
    w.local_world_size = local_size.value_or(w.world_size);
    local_size_from = local_size ? read_from("OMPI_COMM_WORLD_LOCAL_SIZE", *local_size)
                                 : defaulted("the local world size", w.local_world_size,
                                             "OMPI_COMM_WORLD_LOCAL_SIZE is not set: OMPI_COMM_WORLD_SIZE");
    w.group_rank = w.rank / w.local_world_size;
  }

  if (w.source != WorldSource::Single) {
    TANDEM_CHECK(w.rank < w.world_size,
            rank_name + "=" + std::to_string(w.rank) + " must be less than " + size_from);
    TANDEM_CHECK(w.local_world_size <= w.world_size, local_size_from + " must not exceed " + size_from);
    TANDEM_CHECK(w.local_rank < w.local_world_size, local_rank_name + "=" + std::to_string(w.local_rank) +
                                                   " must be less than " + local_size_from);
  }

  if (auto addr = env.text("MASTER_ADDR")) {
    w.master_addr = *addr;
  } else if (w.source == WorldSource::Slurm && w.world_size > 1) {  // Note [Slurm's rank 0]
    if (auto list = env.text("SLURM_STEP_NODELIST")) {
      w.master_addr = first_slurm_host("SLURM_STEP_NODELIST", *list);
      w.master_addr_from = "the first node of SLURM_STEP_NODELIST=" + *list;
    }
  }
  if (auto port = lookup("MASTER_PORT")) {
    w.master_port = parse_int("MASTER_PORT", *port, 1, 65535, "a TCP port number in 1..65535");
  } else if (w.source == WorldSource::Slurm && w.world_size > 1) {
    w.master_port = slurm_port(env, lookup);
  }
  if (w.world_size > 1) {
    // How a user of this source sets the two variables.
    const std::string world = "a world of " + std::to_string(w.world_size) + " ranks" +
                              (w.source == WorldSource::Torchrun ? "" : " (" + size_from + ")");
    const std::string addr_example =
        w.source == WorldSource::OpenMpi ? "mpirun -x MASTER_ADDR=127.0.0.1"
        : w.source == WorldSource::Slurm ? "start the tasks with srun, which sets SLURM_STEP_NODELIST, or MASTER_ADDR=$(scontrol show hostnames | head -n 1)"
                                         : "MASTER_ADDR=127.0.0.1";
    const std::string port_example = w.source == WorldSource::OpenMpi ? "mpirun -x MASTER_PORT=29500"
                                      : w.source == WorldSource::Slurm ? "srun sets SLURM_JOB_ID, or MASTER_PORT=29500"
                                                                       : "MASTER_PORT=29500";
    TANDEM_CHECK(!w.master_addr.empty(),
            "MASTER_ADDR is not set: " + world + " needs the host of rank 0 (e.g. " + addr_example + ")");
    TANDEM_CHECK(w.master_port != 0,
            "MASTER_PORT is not set: " + world + " needs rank 0's store port (e.g. " + port_example + ")");
  }
  w.restart_count = env.index("TORCHELASTIC_RESTART_COUNT").value_or(0);
  w.max_restarts = env.index("TORCHELASTIC_MAX_RESTARTS").value_or(0);
  w.requeue_count = env.index("SLURM_RESTART_COUNT").value_or(0);
  if (auto id = lookup("TORCHELASTIC_RUN_ID")) w.run_id = *id;
  // torchrun writes Python's str(bool); PyTorch compares with "True". Anything else is a typo
  // that would silently make rank 0 fight the agent for its port: refuse it.
  if (auto agent = lookup("TORCHELASTIC_USE_AGENT_STORE")) {
    TANDEM_CHECK(*agent == "True" || *agent == "False",
            "TORCHELASTIC_USE_AGENT_STORE=\"" + *agent +
                "\" is not valid: expected True or False (as torchrun writes it)");
    w.use_agent_store = *agent == "True";
  }
  return w;
}

c10::Device World::device(bool use_cuda) const {
  if (!use_cuda) return c10::Device(c10::DeviceType::CPU);
  // c10::DeviceIndex is 8 bits: a larger local rank would wrap round to another device, or to a
  // negative index that LibTorch's release build does not check.
  constexpr int kMaxIndex = std::numeric_limits<c10::DeviceIndex>::max();
  TANDEM_CHECK(local_rank <= kMaxIndex, "the local rank ", local_rank,
               " cannot name a CUDA device: LibTorch numbers a host's devices 0 to ", kMaxIndex);
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(local_rank));
}

std::string World::describe() const {
  std::ostringstream out;
  out << "rank " << rank << "/" << world_size << " (local " << local_rank << "/"
      << local_world_size << ", node " << group_rank << ")";
  if (!master_addr.empty()) out << " master " << master_addr << ":" << master_port;
  if (use_agent_store) out << " (agent store)";
  if (!run_id.empty()) out << " run " << run_id;
  out << " restart " << restart_count << "/" << max_restarts << " via " << to_string(source);
  return out.str();
}

}  // namespace tandem::comm
