#!/usr/bin/env bash
# fashion_mnist_sigterm.sh TANDEM FASHION_MNIST: Note [Stopping on a signal] in the main job. Two
# processes, one epoch; once its step-200 checkpoint exists the launcher gets SIGTERM (as from
# Slurm's preemption): both processes agree on a step, save it, and end with 143; the launcher
# exits 143. The job started again (SLURM_RESTART_COUNT=1) resumes there by itself and ends with
# the uninterrupted run's accuracy, to the image (the same weights).
set -u
tandem="$1"; example="$2"
source "$(dirname "$0")/../faults/lib.sh"
scratch_dir work
accuracy='test accuracy [0-9.]+% \([0-9]+/10000 images\)'
run_job "$work/uninterrupted.log" 500 "$tandem" run --nproc-per-node 2 -- "$example" --epochs 1 --checkpoints "$work/ref.ckpt"
[[ $RC -eq 0 ]] || fail "the uninterrupted run exited $RC"
start_job "$work/stopped.log" 500 "$tandem" run --nproc-per-node 2 --grace-period 60 -- \
  "$example" --epochs 1 --checkpoints "$work/ckpt" --checkpointing-steps 200
wait_for "$work/ckpt/checkpoint_000200" 300
# The launcher only (anchored: not the `timeout` around it, which would pass a second SIGTERM on,
# and a second signal means "kill now").
pkill -TERM -f -- "^$tandem run --nproc-per-node 2 --grace-period 60 -- $example" || fail "no launcher to signal"
signalled=$(now_ns)
finish_job
cut -d' ' -f2- "$work/stopped.log" | grep -v "^\[rank.\]: train" | tail -5
[[ $RC -eq 143 ]] || fail "the stopped launcher exited $RC, not 143 (128 + SIGTERM)"
line=$(grep -o "stopped by signal 15 after step [0-9]*: checkpoint [^ ]*" "$work/stopped.log") || fail "no checkpoint on SIGTERM"
step=$(awk '{ print $7 }' <<<"${line%%:*}")
saved=$(grep -F "stopped by signal 15 after step" "$work/stopped.log" | head -1 | cut -d' ' -f1)
echo "sigterm: $line, $(ms_between "$signalled" "$saved") ms after the signal"
(( step > 200 )) || fail "the checkpoint on SIGTERM is of step $step, not after step 200"
SLURM_RESTART_COUNT=1 run_job "$work/resumed.log" 500 "$tandem" run --nproc-per-node 2 -- \
  "$example" --epochs 1 --checkpoints "$work/ckpt"
[[ $RC -eq 0 ]] || fail "the resumed run exited $RC"
grep -q "resumed from $work/ckpt/checkpoint_$(printf %06d "$step") at step $step (epoch 0)" "$work/resumed.log" \
  || fail "the job started again did not resume from the step-$step checkpoint"
want=$(grep -Eo "$accuracy" "$work/uninterrupted.log"); got=$(grep -Eo "$accuracy" "$work/resumed.log")
echo "sigterm: resumed at step $step: $got; uninterrupted: $want"
[[ -n $want && "$got" == "$want" ]] || fail "the resumed run's accuracy differs from the uninterrupted run's"
echo "sigterm: ok"
