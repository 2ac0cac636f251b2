#include "launch/mpirun_command.h"

#include <map>
#include <set>

namespace tandem::launch {

int mpirun_kill_step_seconds(const LaunchOptions& o) {
  const long half_ms = o.grace_period.count() / 2;
  return static_cast<int>(std::max(1L, (half_ms + 999) / 1000));
}

MpirunCommand build_mpirun_command(const LaunchOptions& o, int attempt, bool as_root,
                                   const std::vector<std::string>& environ) {
  // Rank variables of other launchers, which World::from_env() reads before OMPI_COMM_WORLD_*.
  static const std::set<std::string> kNotInherited = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"};
  std::map<std::string, std::string> exported = {
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"TANDEM_CPU_BACKEND", "mpi"},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
      // Rank 0 hosts the store: never inherit a torchrun agent's "connect to mine".
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TANDEM_LOG_DIR", o.log_dir},
  };
  MpirunCommand c;
  bool omp_set = false;
  for (const auto& entry : environ) {
    const std::string key = entry.substr(0, entry.find('='));
    if (key == "OMP_NUM_THREADS") omp_set = true;
    if (!kNotInherited.count(key) && !exported.count(key)) c.env.push_back(entry);
  }
  for (const auto& [key, value] : exported) c.env.push_back(key + "=" + value);

  const int world = o.nproc * o.nnodes;
  c.argv = {o.mpirun_path, "-np", std::to_string(world), "--oversubscribe", "--bind-to", "none"};
  if (as_root) c.argv.push_back("--allow-run-as-root");
  c.argv.push_back("--tag-output");
  if (!o.host_list.empty()) {
    std::string hosts;
    for (const auto& h : o.host_list) hosts += (hosts.empty() ? "" : ",") + h + ":" + std::to_string(o.nproc);
    c.argv.insert(c.argv.end(), {"--host", hosts, "--map-by", "ppr:" + std::to_string(o.nproc) + ":node"});
  }
  c.argv.insert(c.argv.end(), {"--mca", "odls_base_sigkill_timeout", std::to_string(mpirun_kill_step_seconds(o))});
  for (const auto& [key, value] : exported) c.argv.insert(c.argv.end(), {"-x", key + "=" + value});
  // Several ranks on one node would oversubscribe the cores with one OpenMP pool each. A value
  // set here goes to every node as it is.
  if (omp_set) {
    c.argv.insert(c.argv.end(), {"-x", "OMP_NUM_THREADS"});
  } else if (o.nproc > 1) {
    c.argv.insert(c.argv.end(), {"-x", "OMP_NUM_THREADS=1"});
  }
  c.argv.push_back(o.program_path);
  c.argv.insert(c.argv.end(), o.command.begin() + (o.command.empty() ? 0 : 1), o.command.end());
  return c;
}

}  // namespace tandem::launch
