#!/usr/bin/env bash
# doctor_test.sh TANDEM FAULTS: a job whose rank 1 stops calling collectives fails, and afterwards
# `tandem doctor LOGDIR` reads every rank's flight record from the job's log folder and names
# rank 1 and the collective it did not reach (as `tandem run` printed when the job failed); a
# folder without records is a one-line error.
set -u
tandem="$1"; faults="$2"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
fail() { echo "FAIL: $*"; exit 1; }
TANDEM_TEST_COLLECTIVE_TIMEOUT_MS=3000 timeout 90 "$tandem" run --nproc-per-node 3 --log-dir "$work/logs" -- \
  "$faults" --scenario=hang-rank-1 > "$work/run.out" 2>&1 && fail "the job succeeded"
"$tandem" doctor "$work/logs" > "$work/doctor.out" 2>&1 || { cat "$work/doctor.out"; fail "tandem doctor failed"; }
cat "$work/doctor.out"
grep -q "^tandem doctor: 3 flight record(s) of a world of 3$" "$work/doctor.out" || fail "not every rank's record"
grep -Eq "^the world group: rank 1 did not reach collective #4 \(all_reduce \(sum\) of Float\[4\] on cpu, issued by ranks 0, 2\); its last was #3" \
  "$work/doctor.out" || fail "rank 1 and collective #4 are not named"
grep -q "^rank 1 (dumped on SIGUSR1): last completed collective #3" "$work/doctor.out" || fail "rank 1's last operation"
mkdir "$work/empty"
out=$("$tandem" doctor "$work/empty" 2>&1); rc=$?
[[ $rc -ne 0 ]] || fail "an empty folder passed"
[[ "$out" == "tandem: tandem doctor: no flight records (flight_rank_*.txt) in $work/empty or its last attempt_<n> folder" ]] \
  || fail "unexpected message: $out"
out=$("$tandem" doctor "$work/nowhere" 2>&1); rc=$?
[[ $rc -ne 0 && "$out" == "tandem: tandem doctor: $work/nowhere is not a folder" ]] || fail "unexpected: $rc $out"
echo "doctor_test: ok"
