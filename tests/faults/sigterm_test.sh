#!/usr/bin/env bash
# sigterm_test.sh TANDEM TRAINER REFERENCE: SIGTERM to `tandem run` with --grace-period 5. The
# launcher forwards it to both workers, which wait after step 6 for it (so the step is known),
# agree to stop, write checkpoint_000006 with save_state and exit; rank 1 then ignores SIGTERM and
# lingers, so the launcher must SIGKILL it when the grace period ends. Then:
#   - the launcher exits 143 (128 + SIGTERM) and no worker pid is alive (kill -0);
#   - checkpoint_000006 is complete (its manifest verifies) and holds the uninterrupted run's
#     weights of step 6;
#   - a new job resumes from it and ends bit-identical to the uninterrupted run on both ranks.
set -u
source "$(dirname "$0")/lib.sh"
tandem="$1"; trainer="$2"; ref="$3"
scratch_dir work  # tests/support/logs.sh: the logs are printed on failure
ckpt="$work/checkpoints"; grace=5; mkdir "$work/first" "$work/second"
start_job "$work/first.log" 120 "$tandem" run --nproc-per-node 2 --grace-period "$grace" --log-dir "$work/logs1" -- \
  "$trainer" train --root "$ckpt" --out "$work/first" --steps 20 --every 4 \
  --save-on-sigterm --wait-for-sigterm-at 6 --linger-rank 1
wait_for "$work/first/waiting.r0" 60
wait_for "$work/first/waiting.r1" 60
pids=("$(cat "$work/first/pid.a0.r0")" "$(cat "$work/first/pid.a0.r1")")
launcher=$(parent_of "${pids[0]}")
[[ "$(parent_of "${pids[1]}")" == "$launcher" ]] || fail "the workers have different parents"
term=$(now_ns)
kill -TERM "$launcher"
finish_job
ended=$(now_ns)
cut -d' ' -f2- "$work/first.log"
[[ $RC -eq 143 ]] || fail "the launcher exited $RC, expected 143 (128 + SIGTERM)"
expect_gone "${pids[@]}" "$launcher"
grep -qF "got Terminated: stopping all workers" "$work/first.log" || fail "the launcher did not forward SIGTERM"
for r in 0 1; do
  [[ -e "$work/first/sigterm_saved.r$r" ]] || fail "rank $r did not finish save_state after SIGTERM"
  grep -qx "saved-on-sigterm 6 $ckpt/checkpoint_000006" "$work/first/trace.a0.r$r" || fail "rank $r: no checkpoint of step 6"
done
[[ -e "$work/first/lingering.r1" ]] || fail "rank 1 did not linger: the SIGKILL path was not exercised"
saved=$(sort -n "$work"/first/sigterm_saved.r* | tail -1)
"$trainer" inspect --root "$ckpt" > "$work/inspect.txt" 2>&1 || { cat "$work/inspect.txt"; fail "checkpoint_000006 does not load"; }
[[ "$(head -1 "$work/inspect.txt")" == "listed checkpoint_000004 checkpoint_000006" ]] || fail "list_checkpoints: $(head -1 "$work/inspect.txt")"
compare_step "$work/inspect.txt" "$ref/trace.a0.r0" "step 6"
run_job "$work/second.log" 120 "$tandem" run --nproc-per-node 2 --log-dir "$work/logs2" -- \
  "$trainer" train --root "$ckpt" --out "$work/second" --steps 20 --every 4
[[ $RC -eq 0 ]] || { cut -d' ' -f2- "$work/second.log"; fail "the resumed job failed (exit $RC)"; }
for r in 0 1; do
  [[ "$(head -1 "$work/second/trace.a0.r$r")" == "resumed 6 $ckpt/checkpoint_000006" ]] \
    || fail "rank $r did not resume from step 6: $(head -1 "$work/second/trace.a0.r$r")"
  compare_step "$work/second/trace.a0.r$r" "$ref/trace.a0.r$r" final
done
echo "sigterm: SIGTERM -> checkpoint_000006 committed on both ranks $(ms_between "$term" "$saved") ms," \
     "-> launcher exit $(ms_between "$term" "$ended") ms (grace period $grace s; rank 1 lingered and was killed)"
echo "sigterm: ok: exit 143, no worker left, the grace-period checkpoint resumed bit for bit"
