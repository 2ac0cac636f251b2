#!/usr/bin/env bash
# mpi_test.sh MODE TANDEM: `tandem run --backend mpi|gloo` end to end with small shell workers
# (no LibTorch). Exit 77 (ctest: skipped) where Open MPI's mpirun is not installed. MODE:
#   env       2 ranks through mpirun: OMPI_COMM_WORLD_RANK 0 and 1, one MASTER_PORT, the
#             TANDEM_CPU_BACKEND / TORCHELASTIC_* / OMP_NUM_THREADS exports, no RANK or
#             WORLD_SIZE (not even one the launcher inherited), "[rankN]: " prefixes, per-rank logs
#   gloo-env  --backend gloo: the launcher's own workers, with TANDEM_CPU_BACKEND=gloo
#   restart   rank 1 exits 3 in attempt 0; --max-restarts 1 reruns mpirun, attempt 1 succeeds
#   fail      rank 1 exits 3: the launcher exits 1 and names rank 1 and its log
#   sigterm   SIGTERM to the launcher (--grace-period 3): both ranks get SIGTERM at once, rank 0
#             exits, rank 1 ignores it and lingers with a child in a session of its own (setsid,
#             beyond any process group a signal reaches); the launcher exits 143
#             within the grace period plus 3 s, and no pid of the job is left (kill -0)
set -u
mode="$1"; tandem="$2"
source "$(dirname "$0")/../support/logs.sh"
command -v mpirun > /dev/null || { echo "SKIPPED: no mpirun on PATH (Debian: openmpi-bin)"; exit 77; }
scratch_dir work  # tests/support/logs.sh: the logs are printed on failure
fail() { echo "FAIL: $*"; exit 1; }
out="$work/out.log"

case "$mode" in
  env)
    RANK=7 WORLD_SIZE=9 LOCAL_RANK=3 timeout -s KILL 60 "$tandem" run --backend mpi --nproc-per-node 2 \
      --log-dir "$work/logs" -- env > "$out" 2>&1; rc=$?
    cat "$out"
    [[ $rc -eq 0 ]] || fail "tandem run exited $rc"
    grep -q "mpirun command: .*mpirun -np 2 --oversubscribe --bind-to none" "$out" || fail "no mpirun command note"
    for r in 0 1; do
      grep -qx "\[rank$r\]: OMPI_COMM_WORLD_RANK=$r" "$out" || fail "rank $r: no OMPI_COMM_WORLD_RANK=$r"
      for v in TANDEM_CPU_BACKEND=mpi MASTER_ADDR=127.0.0.1 TORCHELASTIC_RESTART_COUNT=0 OMP_NUM_THREADS=1 \
               TORCHELASTIC_USE_AGENT_STORE=False "TANDEM_LOG_DIR=$work/logs"; do
        grep -qx "\[rank$r\]: $v" "$out" || fail "rank $r: no $v"
      done
      grep -qx "OMPI_COMM_WORLD_RANK=$r" "$work/logs/attempt_0/rank_$r.stdout.log" || fail "rank $r: log file lacks its output"
    done
    grep -E "^\[rank[01]\]: (RANK|WORLD_SIZE|LOCAL_RANK)=" "$out" && fail "a torchrun rank variable reached a rank"
    ports="$(grep -E '^\[rank[01]\]: MASTER_PORT=' "$out" | cut -d= -f2 | sort -u)"
    [[ $(wc -l <<<"$ports") -eq 1 && -n "$ports" ]] || fail "the ranks saw different MASTER_PORTs: $ports"
    grep -q "^\[rank2\]" "$out" && fail "a third rank"
    echo "mpi env: ok: 2 ranks, one MASTER_PORT ($ports), prefixed output and per-rank logs" ;;
  gloo-env)
    timeout -s KILL 60 "$tandem" run --backend gloo --nproc-per-node 2 -- env > "$out" 2>&1; rc=$?
    [[ $rc -eq 0 ]] || { cat "$out"; fail "tandem run exited $rc"; }
    for r in 0 1; do
      grep -qx "\[rank$r\]: TANDEM_CPU_BACKEND=gloo" "$out" || fail "rank $r: no TANDEM_CPU_BACKEND=gloo"
      grep -qx "\[rank$r\]: RANK=$r" "$out" || fail "rank $r: not started by the launcher itself (RANK)"
    done
    grep -q "OMPI_COMM_WORLD" "$out" && fail "--backend gloo went through mpirun"
    echo "gloo env: ok" ;;
  restart|fail)
    cat > "$work/worker.sh" <<'W'
#!/bin/bash
echo "attempt $TORCHELASTIC_RESTART_COUNT rank $OMPI_COMM_WORLD_RANK"
[[ "$OMPI_COMM_WORLD_RANK" == 1 && "$TORCHELASTIC_RESTART_COUNT" == 0 ]] && exit 3
exit 0
W
    chmod +x "$work/worker.sh"
    restarts=0; [[ $mode == restart ]] && restarts=1
    timeout -s KILL 60 "$tandem" run --backend mpi --nproc-per-node 2 --max-restarts $restarts \
      --log-dir "$work/logs" -- "$work/worker.sh" > "$out" 2>&1; rc=$?
    cat "$out"
    # mpirun names the first failed rank in a closing block ("Process name: [[J,1],1] / Exit code:
    # 3"), but not always: one run in a few under load it prints only "Primary job terminated
    # normally, but 1 process returned a non-zero exit code". The launcher names the rank when
    # mpirun does, and always gives mpirun's exit status and log.
    if grep -q "Process name:" "$out"; then
      grep -q "tandem run: rank 1 failed (mpirun: .*Exit code: 3); mpirun ended with exit code 3; its log: $work/logs/attempt_0/rank_1.stderr.log" "$out" \
        || fail "mpirun named the failed rank, the launcher did not"
    else
      grep -q "tandem run: mpirun ended with exit code 3; its log: $work/logs/attempt_0/mpirun.log" "$out" \
        || fail "no line with mpirun's exit status and log"
    fi
    if [[ $mode == restart ]]; then
      [[ $rc -eq 0 ]] || fail "the restarted job exited $rc, expected 0"
      grep -q "restarting mpirun and every rank (restart 1 of 1)" "$out" || fail "no restart note"
      for r in 0 1; do grep -qx "\[rank$r\]: attempt 1 rank $r" "$out" || fail "rank $r did not run attempt 1"; done
      echo "mpi restart: ok"
    else
      [[ $rc -eq 1 ]] || fail "the launcher exited $rc, expected 1"
      echo "mpi fail: ok: exit 1, rank 1 named"
    fi ;;
  sigterm)
    cat > "$work/worker.sh" <<'W'
#!/bin/bash
# Each rank records its pid and a child's; rank 1 ignores SIGTERM (the SIGKILL path), and its
# child leaves the rank's process group and session (setsid): only the process tree finds it.
d="$1"; r="$OMPI_COMM_WORLD_RANK"
if [[ $r == 1 ]]; then setsid sleep 300 & else sleep 300 & fi
echo $! > "$d/child.r$r"
echo $$ > "$d/pid.r$r"
if [[ $r == 1 ]]; then
  trap 'echo term > "$d/term.r1"' TERM
else
  trap 'echo term > "$d/term.r0"; exit 0' TERM
fi
echo "ready"
while :; do sleep 0.1; done
W
    chmod +x "$work/worker.sh"
    ( exec timeout -s KILL 60 "$tandem" run --backend mpi --nproc-per-node 2 --grace-period 3 -- "$work/worker.sh" "$work" > "$out" 2>&1 ) &
    job=$!
    for f in pid.r0 pid.r1 child.r0 child.r1; do
      for ((i = 0; i < 600; ++i)); do [[ -s "$work/$f" ]] && break; sleep 0.05; done
      [[ -s "$work/$f" ]] || { cat "$out"; fail "$f did not appear within 30 s"; }
    done
    launcher="$(pgrep -P "$job" -x tandem || true)"
    [[ -n "$launcher" ]] || fail "no launcher process below $job"
    pids=("$launcher" "$(cat "$work/pid.r0")" "$(cat "$work/pid.r1")" "$(cat "$work/child.r0")" "$(cat "$work/child.r1")")
    mapfile -t mpiruns < <(pgrep -P "$launcher")
    start=$(date +%s%N)
    kill -TERM "$launcher"
    wait "$job"; rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    cat "$out"
    [[ $rc -eq 143 ]] || fail "the launcher exited $rc, expected 143 (128 + SIGTERM)"
    (( ms < 6000 )) || fail "the launcher took $ms ms to stop (grace period 3 s)"
    (( ms >= 2500 )) || fail "the launcher stopped after $ms ms: rank 1 lingered, so the grace period should have run"
    for r in 0 1; do [[ -e "$work/term.r$r" ]] || fail "rank $r never got SIGTERM"; done
    sleep 0.2
    for pid in "${pids[@]}" "${mpiruns[@]}"; do
      ! kill -0 "$pid" 2>/dev/null || fail "pid $pid ($(ps -o stat=,cmd= -p "$pid")) is still alive"
    done
    echo "mpi sigterm: ok: exit 143 after $ms ms, launcher, mpirun (${mpiruns[*]}), both ranks and their children gone" ;;
  *) echo "mpi_test.sh: unknown mode '$mode'"; exit 2 ;;
esac
