#!/usr/bin/env bash
# tiny_gpt_pp.sh TANDEM TINY_GPT: the transformer example cut into pipeline stages. Four processes
# with --pp 2 (2 stages x 2 data-parallel ranks) train on the batches of two data-parallel ranks,
# as two processes without a pipeline do, from the same weights: the held-out loss (three
# decimals) must be the same, under DDP (1F1B) and FSDP (GPipe); two processes with --pp 2
# --schedule interleaved (4 stages, 2 per process) as one process without. Then the pipeline's
# checkpoint goes on for a second epoch twice: at its own shape and without a pipeline (2
# processes): both must end at the same held-out loss, so the stages' files are the whole model
# and its AdamW state. Last, Python's safetensors reads the pipeline's weights consolidated by
# `tandem checkpoint consolidate --model 0`: the tensors (names, shapes) of the run without a
# pipeline, and values within 2e-4 of them (2.7e-5 apart when measured).
set -eu
tandem="$1"; example="$2"; python="$3"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
run() {  # run NAME PROCESSES STRATEGY ARGS... (EPOCHS=N: other than 1)
  local name="$1" procs="$2" strategy="$3"; shift 3
  timeout -k 5 200 "$tandem" run --nproc-per-node "$procs" -- "$example" --epochs "${EPOCHS:-1}" --samples 512 --layers 4 \
    --dim 64 --batch-size 16 --strategy "$strategy" --checkpoints "$work/$name.ckpt" "$@" >"$work/$name.log" 2>&1 \
    || { echo "FAIL: $name exited $?"; show_log "$work/$name.log"; exit 1; }
  grep -Eo 'held-out loss [0-9.]+' "$work/$name.log" > "$work/$name.loss" || { echo "FAIL: $name printed no loss"; exit 1; }
}
same() {  # same PLAIN PIPELINED
  cmp -s "$work/$1.loss" "$work/$2.loss" ||
    { echo "FAIL: $2: $(cat "$work/$2.loss"), $1: $(cat "$work/$1.loss")"; show_log "$work/$2.log"; exit 1; }
  grep -q "as pp 2" "$work/$2.log" || { echo "FAIL: $2 did not run as pp 2"; show_log "$work/$2.log"; exit 1; }
  echo "$2: $(cat "$work/$2.loss"), as $1"
}
run ddp 2 ddp
run ddp-pp2 4 ddp --pp 2
run fsdp 2 fsdp
run fsdp-pp2 4 fsdp --pp 2 --schedule gpipe
run one 1 ddp
run interleaved 2 ddp --pp 2 --schedule interleaved
same ddp ddp-pp2
same fsdp fsdp-pp2
same one interleaved
ckpt="$work/ddp-pp2.ckpt/checkpoint_000016"
[[ -d "$ckpt" ]] || { echo "FAIL: the pipeline saved no checkpoint at step 16"; ls -R "$work/ddp-pp2.ckpt"; exit 1; }
EPOCHS=2 run pp2-again 4 ddp --pp 2 --resume-from "$ckpt"
EPOCHS=2 run pp2-by-2 2 ddp --resume-from "$ckpt"
for name in pp2-again pp2-by-2; do
  grep -q "resumed from $ckpt at step 16 (epoch 1)" "$work/$name.log" || { echo "FAIL: $name did not resume"; show_log "$work/$name.log"; exit 1; }
done
cmp -s "$work/pp2-again.loss" "$work/pp2-by-2.loss" || {
  echo "FAIL: resumed without a pipeline: $(cat "$work/pp2-by-2.loss"), at its own shape: $(cat "$work/pp2-again.loss")"
  show_log "$work/pp2-by-2.log"; exit 1; }
echo "pp2-by-2: $(cat "$work/pp2-by-2.loss"), as pp2-again"
for name in fsdp fsdp-pp2; do
  "$tandem" checkpoint consolidate "$work/$name.ckpt" --model 0 --out "$work/$name.safetensors" > /dev/null
done
"$python" - "$work/fsdp.safetensors" "$work/fsdp-pp2.safetensors" <<'PY'
import sys
from safetensors.torch import load_file
whole, piped = load_file(sys.argv[1]), load_file(sys.argv[2])
assert sorted(whole) == sorted(piped), f"names differ: {sorted(set(whole) ^ set(piped))}"
for name, t in whole.items():
    assert t.shape == piped[name].shape, f"{name}: {tuple(t.shape)} without a pipeline, {tuple(piped[name].shape)} with"
    diff = (t - piped[name]).abs().max().item()
    assert diff < 2e-4, f"{name}: largest difference {diff}"
print(f"consolidated: the pipeline's {len(piped)} tensors are those of the run without a pipeline")
PY
echo "tiny_gpt --pp 2 learns to the held-out loss of the same data-parallel ranks without a pipeline (DDP with 1F1B,"
echo "FSDP with GPipe, interleaved), and its checkpoint resumes without a pipeline to the loss it reaches at its own shape"
