#!/usr/bin/env bash
# tiny_gpt_checkpointing.sh TANDEM TINY_GPT: the transformer example with dropout on 2 processes,
# under FSDP and under DDP, trained with and without --activation-checkpointing (every block; under
# FSDP also every 2nd). The oracle: the final checkpoints (weights and AdamW state, every file) are
# the plain run's byte for byte, and each run prints the same held-out loss.
set -eu
tandem="$1"; example="$2"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
run() {  # run NAME STRATEGY ARGS...
  local name="$1" strategy="$2"; shift 2
  timeout -k 5 200 "$tandem" run --nproc-per-node 2 -- "$example" --epochs 1 --samples 256 --layers 3 --dim 32 \
    --batch-size 16 --dropout 0.1 --strategy "$strategy" --checkpoints "$work/$name.ckpt" "$@" >"$work/$name.log" 2>&1 \
    || { echo "FAIL: $name exited $?"; show_log "$work/$name.log"; exit 1; }
  grep -Eo 'held-out loss [0-9.]+' "$work/$name.log" > "$work/$name.loss" || { echo "FAIL: $name printed no loss"; exit 1; }
}
same() {  # same PLAIN OTHER
  local a="$work/$1.ckpt" b="$work/$2.ckpt" files=0
  while IFS= read -r f; do
    cmp "$a/$f" "$b/$f" || { echo "FAIL: $2: $f differs from $1's"; exit 1; }
    files=$((files + 1))
  done < <(cd "$a" && find . -name '*.safetensors' | sort)
  [[ $files -gt 0 ]] || { echo "FAIL: $1 saved no safetensors file"; exit 1; }
  cmp "$work/$1.loss" "$work/$2.loss" || { echo "FAIL: $2's held-out loss differs from $1's"; exit 1; }
  echo "$2: $files files identical to $1's, $(cat "$work/$2.loss")"
}
run fsdp fsdp
run fsdp-ac fsdp --activation-checkpointing
run fsdp-ac2 fsdp --activation-checkpointing --checkpoint-every 2
run ddp ddp
run ddp-ac ddp --activation-checkpointing
same fsdp fsdp-ac
same fsdp fsdp-ac2
same ddp ddp-ac
echo "tiny_gpt with --activation-checkpointing trains bit for bit as without, under FSDP and DDP"
