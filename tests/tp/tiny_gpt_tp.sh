#!/usr/bin/env bash
# tiny_gpt_tp.sh TANDEM TINY_GPT: the transformer example cut over tensor-parallel pairs. Four
# processes with --tp 2 train on the batches of two data-parallel ranks, as two processes without
# it do, from the same weights: the held-out loss (three decimals) must be the same, under FSDP
# and under DDP over the pairs. Then the tensor-parallel run's checkpoint goes on for a second
# epoch twice: at its own shape (4 processes, --tp 2) and at another (2 processes, no tensor
# parallelism, the same 2 data-parallel ranks): both must end at the same held-out loss, so the
# pieces the 4 processes saved are the model and AdamW state the 2 load.
set -eu
tandem="$1"; example="$2"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
run() {  # run NAME PROCESSES STRATEGY ARGS... (EPOCHS=N: other than 1)
  local name="$1" procs="$2" strategy="$3"; shift 3
  timeout -k 5 200 "$tandem" run --nproc-per-node "$procs" -- "$example" --epochs "${EPOCHS:-1}" --samples 512 --layers 2 \
    --dim 64 --batch-size 16 --strategy "$strategy" --checkpoints "$work/$name.ckpt" "$@" >"$work/$name.log" 2>&1 \
    || { echo "FAIL: $name exited $?"; show_log "$work/$name.log"; exit 1; }
  grep -Eo 'held-out loss [0-9.]+' "$work/$name.log" > "$work/$name.loss" || { echo "FAIL: $name printed no loss"; exit 1; }
}
same() {  # same PLAIN TP
  cmp -s "$work/$1.loss" "$work/$2.loss" ||
    { echo "FAIL: $2: $(cat "$work/$2.loss"), $1: $(cat "$work/$1.loss")"; show_log "$work/$2.log"; exit 1; }
  grep -q "as .*tp 2" "$work/$2.log" || { echo "FAIL: $2 did not run as tp 2"; show_log "$work/$2.log"; exit 1; }
  echo "$2: $(cat "$work/$2.loss"), as $1"
}
resumed() {  # resumed NAME CHECKPOINT: the run resumed from it at step 16 (epoch 1)
  grep -q "resumed from $2 at step 16 (epoch 1)" "$work/$1.log" || { echo "FAIL: $1 did not resume"; show_log "$work/$1.log"; exit 1; }
}
run fsdp 2 fsdp
run fsdp-tp2 4 fsdp --tp 2
run ddp 2 ddp
run ddp-tp2 4 ddp --tp 2
same fsdp fsdp-tp2
same ddp ddp-tp2
ckpt="$work/fsdp-tp2.ckpt/checkpoint_000016"
[[ -d "$ckpt" ]] || { echo "FAIL: the tensor-parallel run saved no checkpoint at step 16"; ls -R "$work/fsdp-tp2.ckpt"; exit 1; }
EPOCHS=2 run tp2-again 4 fsdp --tp 2 --resume-from "$ckpt"
EPOCHS=2 run tp2-by-2 2 fsdp --resume-from "$ckpt"
resumed tp2-again "$ckpt"
resumed tp2-by-2 "$ckpt"
cmp -s "$work/tp2-again.loss" "$work/tp2-by-2.loss" || {
  echo "FAIL: resumed without tensor parallelism: $(cat "$work/tp2-by-2.loss"), at its own shape: $(cat "$work/tp2-again.loss")"
  show_log "$work/tp2-by-2.log"; exit 1; }
echo "tp2-by-2: $(cat "$work/tp2-by-2.loss"), as tp2-again"
echo "tiny_gpt --tp 2 at 4 processes learns to the held-out loss of 2 processes without tensor parallelism, and its"
echo "checkpoint resumes without tensor parallelism (2 processes) to the loss it reaches at its own shape"
