#!/usr/bin/env bash
# kill_during_save_test.sh TANDEM TRAINER REFERENCE: kill -9 while save_state writes. The main
# process raises SIGKILL inside save_state of step 8, after the weights, optimizer and RNG files
# are in the checkpoint's temporary folder and before its manifest and rename. Then:
#   - the job fails (no restarts here) and the half-written `.tmp-checkpoint_000008-<pid>` is left;
#   - list_checkpoints offers only checkpoint_000004, which verifies and holds exactly the
#     uninterrupted run's weights of step 4;
#   - a new job resumes from step 4 (load_state_if_any never picks the half-written one), commits
#     a new checkpoint_000008 beside the stale folder, and its steps 5-12 are bit-identical to the
#     uninterrupted run's; the stale folder is ignored (never listed or loaded), not deleted.
set -u
source "$(dirname "$0")/lib.sh"
tandem="$1"; trainer="$2"; ref="$3"
scratch_dir work  # tests/support/logs.sh: the logs are printed on failure
ckpt="$work/checkpoints"; mkdir "$work/first" "$work/second"
run_job "$work/first.log" 120 "$tandem" run --nproc-per-node 2 --log-dir "$work/logs1" -- \
  "$trainer" train --root "$ckpt" --out "$work/first" --steps 12 --every 4 --kill-in-save 8
cut -d' ' -f2- "$work/first.log"
[[ $RC -eq 1 ]] || fail "the job killed in save_state should fail with exit 1, got $RC"
[[ -e "$work/first/killed_at" ]] || fail "the main process was never killed"
killed=$(cat "$work/first/killed_at")
pid0=$(cat "$work/first/pid.a0.r0")
grep -qF "rank 0 (local rank 0, pid $pid0) failed with signal 9" "$work/first.log" || fail "the launcher did not report the SIGKILL"
# The kill landed mid-write: the temporary folder holds some files and no manifest.
tmp="$ckpt/.tmp-checkpoint_000008-$pid0"
echo "after the kill: $(cd "$ckpt" && ls -A | tr '\n' ' ')| $tmp: $(ls -A "$tmp" 2>/dev/null | tr '\n' ' ')"
[[ -d "$tmp" ]] || fail "no temporary folder $tmp: the kill did not land inside save_state"
[[ -f "$tmp/model_0.safetensors" && ! -e "$tmp/manifest.json" ]] || fail "$tmp is not a half-written checkpoint"
[[ ! -e "$ckpt/checkpoint_000008" ]] || fail "checkpoint_000008 exists although its writer was killed"
# What a reader sees: only step 4, complete, with the uninterrupted run's weights of step 4.
"$trainer" inspect --root "$ckpt" > "$work/inspect1.txt" 2>&1 || { cat "$work/inspect1.txt"; fail "checkpoint_000004 does not load"; }
[[ "$(head -1 "$work/inspect1.txt")" == "listed checkpoint_000004" ]] || fail "list_checkpoints: $(head -1 "$work/inspect1.txt")"
compare_step "$work/inspect1.txt" "$ref/trace.a0.r0" "step 4"
# A new job resumes from step 4 and ends as the uninterrupted run did.
run_job "$work/second.log" 120 "$tandem" run --nproc-per-node 2 --log-dir "$work/logs2" -- \
  "$trainer" train --root "$ckpt" --out "$work/second" --steps 12 --every 4
cut -d' ' -f2- "$work/second.log"
[[ $RC -eq 0 ]] || fail "the resumed job failed (exit $RC)"
for r in 0 1; do
  [[ "$(head -1 "$work/second/trace.a0.r$r")" == "resumed 4 $ckpt/checkpoint_000004" ]] \
    || fail "rank $r did not resume from step 4: $(head -1 "$work/second/trace.a0.r$r")"
  for s in $(seq 5 12); do compare_step "$work/second/trace.a0.r$r" "$ref/trace.a0.r$r" "step $s"; done
done
"$trainer" inspect --root "$ckpt" > "$work/inspect2.txt" 2>&1 || { cat "$work/inspect2.txt"; fail "the new checkpoints do not load"; }
[[ "$(head -1 "$work/inspect2.txt")" == "listed checkpoint_000004 checkpoint_000008 checkpoint_000012" ]] \
  || fail "list_checkpoints after the resumed job: $(head -1 "$work/inspect2.txt")"
compare_step "$work/inspect2.txt" "$ref/trace.a0.r0" "step 12"
[[ -d "$tmp" ]] || fail "the stale temporary folder was removed (documented: ignored, left for the user)"
detected=$(time_of "$work/first.log" "failed with signal 9")
echo "kill during save: kill -9 -> launcher reports it $(ms_between "$killed" "$detected") ms; stale $(basename "$tmp") ignored"
echo "kill during save: ok: the previous checkpoint loaded with its exact weights and the resumed run matched bit for bit"
