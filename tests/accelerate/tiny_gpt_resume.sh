#!/usr/bin/env bash
# tiny_gpt_resume.sh TANDEM TINY_GPT: the transformer example under FSDP on 4 processes, 2 epochs
# of 32 steps, a checkpoint every 40 steps (step 40 is mid-epoch 1); then that checkpoint resumed
# under 4, 2 and 3 processes, each finishing the run. The oracle: resumed by 4 (the same world),
# the final weights and AdamW state are the uninterrupted run's byte for byte; resumed by 2 and 3 (the
# rest of the epoch shared among them) every run must have learned the language (held-out loss
# under 1.5 nats, where guessing costs 4.16 and the language's entropy is 0.69).
set -eu
tandem="$1"; example="$2"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
run() {  # run NAME NPROC ARGS...
  local name="$1" nproc="$2"; shift 2
  timeout -k 5 200 "$tandem" run --nproc-per-node "$nproc" -- "$example" --epochs 2 --samples 2048 --strategy fsdp \
    --checkpoints "$work/$name.ckpt" "$@" >"$work/$name.log" 2>&1 || { echo "FAIL: $name exited $?"; exit 1; }
  local loss
  loss=$(grep -Eo 'held-out loss [0-9.]+' "$work/$name.log" | awk '{print $3}')
  [[ -n $loss ]] && awk -v l="$loss" 'BEGIN { exit !(l < 1.5) }' || {
    echo "FAIL: $name did not learn (held-out loss '${loss}')"; show_log "$work/$name.log"; exit 1; }
  echo "$name: $(grep -E 'resumed from|held-out loss' "$work/$name.log" | sed 's/^\[rank0\]: //; s/, checkpoint.*//' | tr '\n' ' ')"
}
run four 4 --checkpointing-steps 40
mid="$work/four.ckpt/checkpoint_000040"
[[ -d "$mid" ]] || { echo "FAIL: no checkpoint at step 40"; exit 1; }
for n in 4 2 3; do
  run "resumed-by-$n" "$n" --resume-from "$mid"
  grep -q "resumed from $mid at step 40 (epoch 1)" "$work/resumed-by-$n.log" || { echo "FAIL: resumed-by-$n did not resume"; exit 1; }
done
# Each rank's rows of the weights and of the AdamW state (Note [Sharded checkpoints]).
for r in 0 1 2 3; do
  for f in model_0.rank$r.safetensors optimizer_0.rank$r.safetensors; do
    cmp "$work/four.ckpt/checkpoint_000064/$f" "$work/resumed-by-4.ckpt/checkpoint_000064/$f" || {
      echo "FAIL: resumed by 4 processes, $f differs from the uninterrupted run's"; exit 1; }
  done
done
echo "a checkpoint of 4 FSDP processes resumed under 4 (the same final weights and state, byte for byte), 2 and 3"
