#!/usr/bin/env bash
# mpi_killed_rank_test.sh TANDEM FAULTS_BINARY: under `tandem run --backend mpi`, rank 1 is
# killed with SIGKILL while rank 0 waits in an all-reduce with a 60 s timeout. Passes when the
# launcher exits non-zero, mpirun reports the killed rank, rank 0 never reached its own timeout
# (mpirun ended the job: a dead rank never leaves the others waiting on MPI), and no rank process
# is left. The 90 s limit only guards against a hang.
set -u
tandem="$1"; binary="$2"
out="$(mktemp)"; trap 'rm -f "$out"' EXIT
start=$(date +%s%N)
TANDEM_TEST_COLLECTIVE_TIMEOUT_MS=60000 timeout --kill-after=5 90 \
  "$tandem" run --backend mpi --nproc-per-node 2 -- "$binary" --scenario=hang-rank-1 > "$out" 2>&1 &
job=$!
# Rank 1, once it says it stopped calling collectives (rank 0 is then in the all-reduce).
victim=""
for _ in $(seq 1 300); do
  if grep -q "rank 1: no longer calling collectives" "$out"; then
    for pid in $(pgrep -f -- "$binary --scenario=hang-rank-1"); do
      tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && victim=$pid
    done
    [[ -n "$victim" ]] && break
  fi
  sleep 0.1
done
[[ -n "$victim" ]] || { cat "$out"; echo "FAIL: rank 1 never reached its injection point"; kill $job; exit 1; }
killed=$(date +%s%N)
kill -9 "$victim"
wait $job; rc=$?
end=$(date +%s%N)
cat "$out"
echo "mpi_killed_rank: launcher exit $rc, $(( (end - killed) / 1000000 )) ms after rank 1 (pid $victim) was killed"
[[ $rc -ne 0 ]] || { echo "FAIL: the job succeeded"; exit 1; }
[[ $rc -ne 124 && $rc -ne 137 ]] || { echo "FAIL: the job hung"; exit 1; }
grep -q "signal 9" "$out" || { echo "FAIL: mpirun did not report rank 1 killed by signal 9"; exit 1; }
! grep -q "timed out" "$out" || { echo "FAIL: rank 0 waited for its collective timeout instead of mpirun ending the job"; exit 1; }
left=$(pgrep -f -- "$binary --scenario=hang-rank-1" || true)
[[ -z "$left" ]] || { echo "FAIL: rank processes left: $left"; exit 1; }
echo "mpi_killed_rank: ok"
