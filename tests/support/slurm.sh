# Sourced by the Slurm tests (ctest label `slurm`): a private Slurm on this machine, started and
# stopped by the test itself, with nothing shared with a system Slurm (its own munge key and
# socket, configuration, ports, state and spool folders, pid files).
#
# slurm_start [CPUS]  starts munged, slurmctld and one slurmd (the node named as this host, as
#                     Slurm sites name nodes, address 127.0.0.1, CPUS processors, default 4: more than this machine has is allowed, so that a
#                     4-task step fits a 2-core machine) under $work/slurm (needs `scratch_dir work`
#                     first), exports SLURM_CONF so that srun, sbatch, squeue and scancel use it,
#                     and waits until the node is idle. Exits 77 (ctest: skipped) when Slurm or
#                     munge is not installed (scripts/setup installs them) or we are not root.
# slurm_start_two_hosts [CPUS]  the same across two network-namespace hosts (tests/support/
#                     two_hosts.sh first): slurmctld and slurmd `nodea` in A, slurmd `nodeb` in B,
#                     the names in a hosts file each daemon sees as /etc/hosts; client commands
#                     run in A through `in_host "$A" CMD...`.
# slurm_stop          stops the daemons (TERM, then KILL after 5 s); run at exit by slurm_start's
#                     on_exit. The daemons run in the foreground as children of the test with a
#                     parent-death signal (setpriv --pdeathsig KILL), so even a test killed with
#                     SIGKILL (ctest's timeout) leaves no daemon behind.
# slurm_show_logs     prints the daemons' logs (for a failing test).
source "$(dirname "${BASH_SOURCE[0]}")/logs.sh"
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"

# The daemons' common part: munged, then slurm.conf with the NodeName lines $1 and the controller
# $2 (host(address)), exported as SLURM_CONF. Sets SLURM_DIR and SLURM_PIDS.
_slurm_begin() {
  local tool
  for tool in munged slurmctld slurmd srun sbatch squeue scontrol; do
    command -v "$tool" >/dev/null || { echo "SKIPPED: $tool is not installed (scripts/setup installs Slurm and munge)"; exit 77; }
  done
  (( EUID == 0 )) || { echo "SKIPPED: a private slurmd must run as root here (SlurmUser=root)"; exit 77; }
  SLURM_DIR="$work/slurm"
  mkdir -p "$SLURM_DIR"/{state,spool,log,munge}
  chmod 700 "$SLURM_DIR/munge"
  # munge: a key of our own, its socket in our folder (AuthInfo tells Slurm where).
  dd if=/dev/urandom of="$SLURM_DIR/munge/key" bs=1024 count=1 status=none && chmod 400 "$SLURM_DIR/munge/key"
  on_exit slurm_stop
  trap 'exit 143' TERM INT  # the EXIT trap (slurm_stop) runs on these too
  SLURM_PIDS=()
  setpriv --pdeathsig KILL munged --foreground --force --key-file "$SLURM_DIR/munge/key" \
    --socket "$SLURM_DIR/munge/socket" --pid-file "$SLURM_DIR/munge/pid" --log-file "$SLURM_DIR/log/munged.log" \
    --seed-file "$SLURM_DIR/munge/seed" &
  SLURM_PIDS+=($!)
  local i
  for i in $(seq 50); do [[ -S $SLURM_DIR/munge/socket ]] && break; sleep 0.1; done
  [[ -S $SLURM_DIR/munge/socket ]] || { echo "FAIL: munged did not start"; slurm_show_logs; exit 1; }
  local ctld_port slurmd_port
  ctld_port=$(free_port); slurmd_port=$(free_port)
  while [[ $slurmd_port == "$ctld_port" ]]; do slurmd_port=$(free_port); done
  cat >"$SLURM_DIR/slurm.conf" <<EOF
ClusterName=tandem
SlurmctldHost=$2
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_DIR/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=5
InactiveLimit=0
$1
PartitionName=tandem Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
}

# _slurm_wait_idle NODE...: until sinfo (through $SLURM_RUN) shows every node idle.
_slurm_wait_idle() {
  local i node idle
  for i in $(seq 100); do
    idle=1
    for node in "$@"; do [[ "$("${SLURM_RUN[@]}" sinfo -h -N -n "$node" -o %t 2>/dev/null)" == idle ]] || idle=0; done
    (( idle )) && return 0
    sleep 0.2
  done
  echo "FAIL: the private Slurm's nodes never became idle: $("${SLURM_RUN[@]}" sinfo -N 2>&1 | tr '\n' ' ')"; slurm_show_logs; exit 1
}

slurm_start() {
  local cpus="${1:-4}"
  SLURM_NODE=$(hostname)
  SLURM_RUN=()
  _slurm_begin "NodeName=$SLURM_NODE NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN" "$(hostname)(127.0.0.1)"
  mkdir -p "$SLURM_DIR/spool/$SLURM_NODE"
  setpriv --pdeathsig KILL slurmctld -D -i -f "$SLURM_CONF" &
  SLURM_PIDS+=($!)
  setpriv --pdeathsig KILL slurmd -D -N "$SLURM_NODE" -f "$SLURM_CONF" &
  SLURM_PIDS+=($!)
  _slurm_wait_idle "$SLURM_NODE"
}

# in_host NS CMD...: CMD in network namespace NS with $SLURM_DIR/hosts (which names nodea and
# nodeb) as its /etc/hosts, bind-mounted in a private mount namespace. Not `ip netns exec`: that
# mounts a fresh /sys, without the cgroup file system slurmd looks for. Each step execs the next,
# so a pid taken of it is CMD's, and a parent-death signal set before it stays with CMD.
_in_host_argv() {
  IN_HOST=(nsenter --net="/run/netns/$1" unshare --mount --propagation private
           sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$SLURM_DIR/hosts")
}
in_host() { local IN_HOST; _in_host_argv "$1"; shift; "${IN_HOST[@]}" "$@"; }

slurm_start_two_hosts() {
  local cpus="${1:-2}" IN_HOST
  _slurm_begin "NodeName=nodea NodeAddr=$ADDR_A CPUs=$cpus State=UNKNOWN
NodeName=nodeb NodeAddr=$ADDR_B CPUs=$cpus State=UNKNOWN" "$(hostname)($ADDR_A)"
  mkdir -p "$SLURM_DIR/spool/nodea" "$SLURM_DIR/spool/nodeb"
  printf '127.0.0.1 localhost\n%s nodea\n%s nodeb\n' "$ADDR_A" "$ADDR_B" > "$SLURM_DIR/hosts"
  SLURM_RUN=(in_host "$A")  # the controller listens in A: every client command runs there
  _in_host_argv "$A"
  setpriv --pdeathsig KILL "${IN_HOST[@]}" slurmctld -D -i -f "$SLURM_CONF" &
  SLURM_PIDS+=($!)
  setpriv --pdeathsig KILL "${IN_HOST[@]}" slurmd -D -N nodea -f "$SLURM_CONF" &
  SLURM_PIDS+=($!)
  _in_host_argv "$B"
  setpriv --pdeathsig KILL "${IN_HOST[@]}" slurmd -D -N nodeb -f "$SLURM_CONF" &
  SLURM_PIDS+=($!)
  _slurm_wait_idle nodea nodeb
}

slurm_stop() {
  [[ -n ${SLURM_DIR:-} ]] || return 0
  local pid i
  # The jobs first: their steps (slurmstepd and the tasks) are not the daemons' children, so a
  # test that failed mid-job would otherwise leave them running once slurmd is gone.
  "${SLURM_RUN[@]}" scancel --full --signal=KILL $("${SLURM_RUN[@]}" squeue -h -o %i 2>/dev/null) 2>/dev/null || true
  for i in $(seq 100); do [[ -z "$("${SLURM_RUN[@]}" squeue -h 2>/dev/null)" ]] && break; sleep 0.1; done || true
  for pid in $(pgrep -f "slurmstepd: \[" 2>/dev/null); do  # ours only: those with a file in our folder
    ls -l "/proc/$pid/fd" 2>/dev/null | grep -qF "$SLURM_DIR" && kill -KILL "$pid" 2>/dev/null
  done || true
  for pid in $(printf '%s\n' "${SLURM_PIDS[@]}" | tac); do  # slurmd, slurmctld, then munged
    kill -TERM "$pid" 2>/dev/null || continue
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done || true
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  SLURM_DIR=""
}

slurm_show_logs() {
  local f
  for f in "$SLURM_DIR"/log/*.log; do [[ -f $f ]] && show_log "$f"; done
}
