#!/usr/bin/env bash
# restart_test.sh TANDEM TRAINER REFERENCE: kill -9 of one rank mid-epoch under
# `tandem run --max-restarts 1`. Rank 1 raises SIGKILL during step 11 (its forward done, rank 0
# waiting in the gradient all-reduce), between the checkpoints of steps 8 and 12, on attempt 0
# only. The launcher must stop rank 0, restart both, and attempt 1 must resume from step 8
# (epoch 1, batch 2 of 6) and end with weights bit-identical to the uninterrupted run's, on every
# rank and at every step after the resume.
set -u
source "$(dirname "$0")/lib.sh"
tandem="$1"; trainer="$2"; ref="$3"
scratch_dir work  # tests/support/logs.sh: the logs are printed on failure
start=$(now_ns)
run_job "$work/launcher.log" 180 "$tandem" run --nproc-per-node 2 --max-restarts 1 --log-dir "$work/logs" -- \
  "$trainer" train --root "$work/checkpoints" --out "$work" --steps 20 --every 4 --kill-rank 1 --kill-step 11
end=$(now_ns)
cut -d' ' -f2- "$work/launcher.log"
[[ $RC -eq 0 ]] || fail "the job did not complete after the restart (exit $RC)"
[[ -e "$work/killed_at" ]] || fail "rank 1 was never killed"
killed=$(cat "$work/killed_at")
grep -qF "rank 1 (local rank 1, pid $(cat "$work/pid.a0.r1")) failed with signal 9" "$work/launcher.log" \
  || fail "the launcher did not report rank 1's SIGKILL"
grep -qF "restarting all workers (restart 1 of 1)" "$work/launcher.log" || fail "no restart"
# The kill landed between two checkpoints: attempt 0 finished step 10 and saved step 8, not 12.
[[ "$(grep '^step ' "$work/trace.a0.r1" | tail -1 | cut -d' ' -f2)" == 10 ]] || fail "rank 1 did not die in step 11"
grep -q '^saved 8 ' "$work/trace.a0.r0" || fail "attempt 0 did not save step 8"
! grep -q '^saved 12 ' "$work/trace.a0.r0" || fail "attempt 0 saved step 12: the kill was not between checkpoints"
for r in 0 1; do
  [[ "$(head -1 "$work/trace.a1.r$r")" == "resumed 8 $work/checkpoints/checkpoint_000008" ]] \
    || fail "rank $r of attempt 1 did not resume from step 8: $(head -1 "$work/trace.a1.r$r")"
  for s in $(seq 1 10); do compare_step "$work/trace.a0.r$r" "$ref/trace.a0.r$r" "step $s"; done
  for s in $(seq 9 20); do compare_step "$work/trace.a1.r$r" "$ref/trace.a0.r$r" "step $s"; done
  compare_step "$work/trace.a1.r$r" "$ref/trace.a0.r$r" final
done
detected=$(time_of "$work/launcher.log" "failed with signal 9")
restarted=$(time_of "$work/launcher.log" "restarting all workers")
started=$(sort -n "$work"/start.a1.r* | tail -1)
resumed=$(sort -n "$work"/resumed.a1.r* | tail -1)
echo "restart: kill -9 -> launcher reports it $(ms_between "$killed" "$detected") ms, -> restart $(ms_between "$killed" "$restarted") ms," \
     "-> both new workers in main() $(ms_between "$killed" "$started") ms, -> resumed from step 8 $(ms_between "$killed" "$resumed") ms;" \
     "whole job $(ms_between "$start" "$end") ms"
echo "restart: ok: final weights and steps 9-20 bit-identical to the uninterrupted run on both ranks"
