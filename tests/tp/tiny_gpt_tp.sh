#!/usr/bin/env bash
# tiny_gpt_tp.sh TANDEM TINY_GPT: the transformer example cut over tensor-parallel pairs. Four
# processes with --tp 2 train on the batches of two data-parallel ranks, as two processes without
# it do, from the same weights: the held-out loss (three decimals) must be the same, under FSDP
# and under DDP over the pairs.
set -eu
tandem="$1"; example="$2"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
run() {  # run NAME PROCESSES STRATEGY ARGS...
  local name="$1" procs="$2" strategy="$3"; shift 3
  timeout -k 5 200 "$tandem" run --nproc-per-node "$procs" -- "$example" --epochs 1 --samples 512 --layers 2 \
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
run fsdp 2 fsdp
run fsdp-tp2 4 fsdp --tp 2
run ddp 2 ddp
run ddp-tp2 4 ddp --tp 2
same fsdp fsdp-tp2
same ddp ddp-tp2
echo "tiny_gpt --tp 2 at 4 processes learns to the held-out loss of 2 processes without tensor parallelism"
