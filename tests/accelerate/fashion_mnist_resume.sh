#!/usr/bin/env bash
# fashion_mnist_resume.sh TANDEM FASHION_MNIST ZERO_STAGE: the main job under 2 processes with
# ZeRO (ZERO_STAGE 1 or 2; "fsdp": fully sharded), one epoch, a checkpoint every 400 steps (step 400 is mid-epoch); then the checkpoint of
# step 400 resumed under 1 and under 3 processes, each finishing the epoch (the rest of it shared
# among its processes). Every run must learn (>= 85 % after the epoch). With ZeRO-1, also a job
# that Slurm requeued (SLURM_RESTART_COUNT=1, no --resume-from): it goes on by itself from the
# newest checkpoint under --checkpoints (docs/cluster.md).
set -eu
tandem="$1"; example="$2"; zero="$3"
if [[ $zero == fsdp ]]; then sharding=(--strategy fsdp); else sharding=(--zero-stage "$zero"); fi
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
accuracy='test accuracy (8[5-9]|9[0-9])\.[0-9]+% \(([0-9]+)/10000 images\)'
run() {  # run NAME NPROC ARGS...
  local name="$1" nproc="$2"; shift 2
  timeout -k 5 500 "$tandem" run --nproc-per-node "$nproc" -- "$example" --epochs 1 "${sharding[@]}" \
    --checkpoints "$work/$name.ckpt" "$@" >"$work/$name.log" 2>&1 || { echo "FAIL: $name exited $?"; exit 1; }
  grep -Eq "$accuracy" "$work/$name.log" || { echo "FAIL: $name did not reach 85 %"; show_log "$work/$name.log"; exit 1; }
  echo "$name: $(grep -E 'resumed from|test accuracy' "$work/$name.log" | sed 's/^tandem: //' | tr '\n' ' ')"
}
run two 2 --checkpointing-steps 400
mid="$work/two.ckpt/checkpoint_000400"
[[ -d "$mid" ]] || { echo "FAIL: no checkpoint at step 400"; exit 1; }
for n in 1 3; do
  run "resumed-by-$n" "$n" --resume-from "$mid"
  grep -q "resumed from $mid at step 400 (epoch 0)" "$work/resumed-by-$n.log" || { echo "FAIL: resumed-by-$n did not resume"; exit 1; }
done
if [[ $zero == 1 ]]; then
  mkdir "$work/requeued.ckpt" && cp -r "$mid" "$work/requeued.ckpt/"
  SLURM_RESTART_COUNT=1 run requeued 2
  grep -q "resumed from $work/requeued.ckpt/checkpoint_000400 at step 400 (epoch 0)" "$work/requeued.log" ||
    { echo "FAIL: the requeued job did not resume by itself"; show_log "$work/requeued.log"; exit 1; }
  # Its end is the uninterrupted run's: the same weights, so the same accuracy, to the image.
  [[ "$(grep -Eo "$accuracy" "$work/requeued.log")" == "$(grep -Eo "$accuracy" "$work/two.log")" ]] ||
    { echo "FAIL: requeued: $(grep -Eo "$accuracy" "$work/requeued.log"), uninterrupted: $(grep -Eo "$accuracy" "$work/two.log")"; exit 1; }
fi
echo "a checkpoint of 2 processes (${sharding[*]}) resumed under 1 and 3"
