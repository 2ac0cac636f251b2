#!/usr/bin/env bash
# rendezvous_test.sh CASE TANDEM TRAINER: the rendezvous store's hardening, on real jobs whose
# workers (fault_trainer hold) join their process group and wait to be released.
#   loopback   a one-node job: every socket its workers listen on, the store's included, is bound
#              to a loopback address (/proc/net/tcp{,6}, matched to the workers' socket inodes).
#   run_id     node 0 of a 2-node job of run 'faults-a' waits for node 1. A node started with run
#              'faults-b', then a hand-started rank 1 without a run id, are refused at once with a
#              message naming both sides and exit non-zero without joining; the rightful node 1
#              then joins and the job succeeds (the refusal is about the id and nothing else).
#   busy_port  while job A holds its store's port, job B with --master-port on that port fails
#              before starting anything (exit 2, the busy-port line); job C without a port runs at
#              the same time as A on another port, and both succeed.
set -u
source "$(dirname "$0")/lib.sh"
case="$1"; tandem="$2"; trainer="$3"
scratch_dir work  # tests/support/logs.sh: the logs are printed on failure

# The listening sockets (address:port in /proc's hex) of these pids, one per line.
listeners_of() {
  local inodes pid
  inodes="$(for pid in "$@"; do ls -l "/proc/$pid/fd" 2>/dev/null; done | sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p' | sort -u)"
  awk -v inodes="$(tr '\n' ' ' <<<"$inodes")" 'BEGIN { n = split(inodes, a, " "); for (i = 1; i <= n; ++i) mine[a[i]] = 1 }
       FNR > 1 && $4 == "0A" && ($10 in mine) { print $2 }' /proc/net/tcp /proc/net/tcp6
}
# 127.0.0.0/8 (tcp: the first octet is the last hex byte), ::1, ::ffff:127.x.y.z.
is_loopback() {
  local addr="${1%:*}"
  [[ ${#addr} -eq 8 && "${addr:6:2}" == 7F ]] || [[ "$addr" == 00000000000000000000000001000000 ]] ||
    [[ "$addr" == 0000000000000000FFFF0000??????7F ]]
}
hex_port() { printf '%04X' "$1"; }

case "$case" in
loopback)
  start_job "$work/job.log" 120 "$tandem" run --nproc-per-node 2 --log-dir "$work/logs" -- "$trainer" hold --dir "$work"
  wait_for "$work/ready.r0" 60; wait_for "$work/ready.r1" 60
  read -r pid0 port < "$work/ready.r0"; read -r pid1 _ < "$work/ready.r1"
  mapfile -t listening < <(listeners_of "$pid0" "$pid1")
  echo "store port $port; the workers listen on: ${listening[*]}"
  store=0
  for l in "${listening[@]}"; do
    is_loopback "$l" || fail "a worker listens on $l, not on loopback"
    [[ "${l#*:}" == "$(hex_port "$port")" ]] && store=1
  done
  [[ $store -eq 1 ]] || fail "no worker listens on the store's port $port: the check looked at the wrong sockets"
  # Nothing on this host listens on the store's port on another address either.
  ! awk 'FNR > 1 && $4 == "0A" { print $2 }' /proc/net/tcp /proc/net/tcp6 | grep ":$(hex_port "$port")\$" | while read -r l; do is_loopback "$l" || echo "$l"; done | grep -q . \
    || fail "port $port is open on a non-loopback address"
  touch "$work/release"; finish_job
  [[ $RC -eq 0 ]] || { cut -d' ' -f2- "$work/job.log"; fail "the job failed (exit $RC)"; }
  echo "loopback: ok: ${#listening[@]} listening sockets of the workers, all on loopback"
  ;;
run_id)
  port=$(free_port) || fail "no free port"
  node=(run --nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$port")
  mkdir "$work/a" "$work/b" "$work/c"
  start_job "$work/node0.log" 120 "$tandem" "${node[@]}" --node-rank 0 --run-id faults-a --log-dir "$work/logs0" -- "$trainer" hold --dir "$work/a"
  node0=$JOB
  t0=$(now_ns)
  run_job "$work/intruder.log" 60 "$tandem" "${node[@]}" --node-rank 1 --run-id faults-b --log-dir "$work/logs1" -- "$trainer" hold --dir "$work/b"
  t1=$(now_ns)
  cut -d' ' -f2- "$work/intruder.log"
  [[ $RC -eq 1 ]] || fail "the worker of run faults-b was not refused (launcher exit $RC)"
  grep -qF "refusing to join: this worker has run 'faults-b' but the store at 127.0.0.1:$port serves run 'faults-a' (check TORCHELASTIC_RUN_ID / --run-id)" \
    "$work/intruder.log" || fail "no message naming both run ids"
  [[ ! -e "$work/b/ready.r1" ]] || fail "the worker of run faults-b joined"
  # A worker started by hand without any run id is refused too.
  t2=$(now_ns)
  env -u TORCHELASTIC_RUN_ID RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
    timeout -s KILL 60 "$trainer" hold --dir "$work/c" > "$work/hand.log" 2>&1; rc=$?
  t3=$(now_ns)
  cat "$work/hand.log"
  [[ $rc -eq 2 ]] || fail "the worker without a run id was not refused (exit $rc)"
  grep -qF "refusing to join: this worker has no run id but the store at 127.0.0.1:$port serves run 'faults-a'" "$work/hand.log" \
    || fail "no message for the worker without a run id"
  # The rightful node 1 joins the same store.
  start_job "$work/node1.log" 120 "$tandem" "${node[@]}" --node-rank 1 --run-id faults-a --log-dir "$work/logs1a" -- "$trainer" hold --dir "$work/a"
  node1=$JOB
  wait_for "$work/a/ready.r0" 60; wait_for "$work/a/ready.r1" 60
  touch "$work/a/release"
  JOB=$node1; finish_job; [[ $RC -eq 0 ]] || { cut -d' ' -f2- "$work/node1.log"; fail "node 1 of run faults-a failed (exit $RC)"; }
  JOB=$node0; finish_job; [[ $RC -eq 0 ]] || { cut -d' ' -f2- "$work/node0.log"; fail "node 0 of run faults-a failed (exit $RC)"; }
  echo "run_id: ok: refused in $(ms_between "$t0" "$t1") ms (whole launcher of run faults-b) and $(ms_between "$t2" "$t3") ms (a process without a run id); run faults-a then completed"
  ;;
busy_port)
  mkdir "$work/a" "$work/b" "$work/c"
  start_job "$work/a.log" 120 "$tandem" run --nproc-per-node 2 --log-dir "$work/logs_a" -- "$trainer" hold --dir "$work/a"
  job_a=$JOB
  wait_for "$work/a/ready.r0" 60; wait_for "$work/a/ready.r1" 60
  read -r _ port_a < "$work/a/ready.r0"
  t0=$(now_ns)
  run_job "$work/b.log" 60 "$tandem" run --nproc-per-node 2 --master-port "$port_a" --log-dir "$work/logs_b" -- "$trainer" hold --dir "$work/b"
  t1=$(now_ns)
  cut -d' ' -f2- "$work/b.log"
  [[ $RC -eq 2 ]] || fail "job B on A's port $port_a exited $RC, expected 2"
  [[ "$(cut -d' ' -f2- "$work/b.log")" == "tandem: --master-port $port_a is busy on 127.0.0.1: another process holds it; choose another port or omit --master-port to pick a free one" ]] \
    || fail "job B did not print exactly the busy-port line"
  [[ -z "$(ls -A "$work/b")" && ! -e "$work/logs_b" ]] || fail "job B started something"
  start_job "$work/c.log" 120 "$tandem" run --nproc-per-node 2 --log-dir "$work/logs_c" -- "$trainer" hold --dir "$work/c"
  job_c=$JOB
  wait_for "$work/c/ready.r0" 60; wait_for "$work/c/ready.r1" 60
  read -r _ port_c < "$work/c/ready.r0"
  [[ "$port_c" != "$port_a" ]] || fail "jobs A and C share port $port_a"
  kill -0 "$(cut -d' ' -f1 "$work/a/ready.r0")" || fail "job A is no longer running beside job C"
  touch "$work/a/release" "$work/c/release"
  JOB=$job_a; finish_job; [[ $RC -eq 0 ]] || { cut -d' ' -f2- "$work/a.log"; fail "job A failed (exit $RC)"; }
  JOB=$job_c; finish_job; [[ $RC -eq 0 ]] || { cut -d' ' -f2- "$work/c.log"; fail "job C failed (exit $RC)"; }
  echo "busy_port: ok: job B refused in $(ms_between "$t0" "$t1") ms (exit 2, nothing started); jobs A (port $port_a) and C (port $port_c) ran at once and succeeded"
  ;;
*) fail "unknown case '$case' (loopback, run_id, busy_port)" ;;
esac
