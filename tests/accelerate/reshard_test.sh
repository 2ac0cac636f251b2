#!/usr/bin/env bash
# reshard_test.sh TANDEM ACCELERATOR_TEST [PYTHON]: checkpoints at another world size, with and
# without ZeRO (docs/checkpoints.md, "At another world size"). Jobs of 4 and 2 processes,
# zero_stage 0, 1 and 2 and FSDP ("zero 3"), train 5 batches of epoch 0 and save; each checkpoint
# is loaded by jobs that save it again at once and train the rest of epoch 0 and epoch 1: every
# sharding it can load into (zero_stage 0, 1, 2, and FSDP at 3 processes, where nothing divides;
# from an FSDP checkpoint: stage 0 and FSDP), each at one other world size (4 shrinks to 2, 2 grows
# to 3), plus one process, plus (from 2) one other stage at the same size. Every pair of source and
# target sharding meets, from both source sizes. The whole product, 56 loads, took 162 s on 2
# cores; these 39 take 118 s.
#   - the saved optimizer state does not depend on ZeRO-1: the consolidated files of the stage 0
#     and stage 1 saves at one world size are the same bytes (ZeRO-1 steps exactly as the whole
#     optimizer; stage 2 adds in another order on Gloo, so its state differs in the last bits);
#   - what loads is what was saved, bit for bit: each re-save's weights and consolidated optimizer
#     state are the same bytes as its source's, whatever the two world sizes and shardings;
#   - every sample of epoch 0 is read exactly once across the two jobs, plus the padding the new
#     world size needs (repeats of samples already read); epoch 1 is a whole epoch at the new size.
set -eu
tandem="$1"; binary="$2"; python="${3:-}"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
export RESHARD_K=5
job() {  # job NAME NPROC ZERO PHASE [FROM]
  RESHARD_OUT="$work/$1" RESHARD_ZERO="$3" RESHARD_PHASE="$4" RESHARD_FROM="${5:-}" RESHARD_TO="$work/$1.ckpt" \
    timeout -k 5 120 "$tandem" run --nproc-per-node "$2" -- "$binary" --scenario=reshard >"$work/$1.log" 2>&1 ||
    { echo "FAIL: job $1 ($2 processes, zero_stage $3, $4) failed (exit $?)"; exit 1; }
  "$tandem" checkpoint consolidate "$work/$1.ckpt" --out "$work/$1.optimizer.safetensors" >/dev/null ||
    { echo "FAIL: tandem checkpoint consolidate $1"; exit 1; }
  # The weights in one file, whether saved whole (stages 0-2) or as each rank's rows (FSDP).
  "$tandem" checkpoint consolidate "$work/$1.ckpt" --model 0 --out "$work/$1.model.safetensors" >/dev/null ||
    { echo "FAIL: tandem checkpoint consolidate --model 0 $1"; exit 1; }
}
newest() { ls -d "$1"/checkpoint_* | tail -1; }
status=0
fail() { echo "FAIL: $*"; status=1; }
name() { case $1 in 3) echo fsdp ;; 4) echo "hsdp 2x2" ;; *) echo "zero $1" ;; esac; }
# load_and_check W Z W2 Z2: a job of W2 processes (Z2) loads the newest checkpoint of save-wW-zZ,
# saves it again and trains on; its weights, optimizer state and samples are checked.
load_and_check() {
  local w=$1 z=$2 w2=$3 z2=$4 src="save-w$1-z$2" result=ok samples
  dst="load-w$w-z$z-to-w$w2-z$z2"
  job "$dst" "$w2" "$z2" load "$(newest "$work/$src.ckpt")"
  cmp -s "$work/$src.model.safetensors" "$work/$dst.model.safetensors" ||
    { fail "$dst: the weights after loading differ from the saved ones"; result=FAIL; }
  cmp -s "$work/$src.optimizer.safetensors" "$work/$dst.optimizer.safetensors" ||
    { fail "$dst: the optimizer state after loading differs from the saved one"; result=FAIL; }
  # Samples: the save job's epoch 0, then the load job's; every id once, plus padding.
  if ! samples=$(python3 - "$work/$src" "$w" "$work/$dst" "$w2" 2>&1 <<'PY'
import collections, glob, math, sys
def read(prefix):
    by_epoch = collections.defaultdict(list)
    for f in glob.glob(prefix + ".rank*"):
        for line in open(f):
            a, b = line.split()
            if a != "loss":
                by_epoch[int(a)].append(int(b))
    return by_epoch
before, after = read(sys.argv[1]), read(sys.argv[3])
w2, n = int(sys.argv[4]), 100
first = before[0]
assert len(first) == len(set(first)), "the first job read a sample twice"
left = n - len(first)
rest = collections.Counter(after[0])
missing = set(range(n)) - set(first) - set(rest)
assert not missing, f"never read in epoch 0: {sorted(missing)[:10]}"
unread = [i for i in range(n) if i not in set(first)]
assert all(rest[i] == 1 for i in unread), "a sample left by the first job was read twice by the second"
padding = math.ceil(left / w2) * w2 - left
assert sum(rest.values()) - len(unread) == padding, f"{sum(rest.values()) - len(unread)} repeats, expected {padding} padding"
assert set(rest) - set(unread) <= set(first), "padding that is not a repeat"
whole = collections.Counter(after[1])
assert set(whole) == set(range(n)) and sum(whole.values()) == math.ceil(n / w2) * w2, "epoch 1 is not a whole epoch"
print(f"epoch 0: {len(first)} + {len(unread)} samples, {padding} padding")
PY
  ); then fail "$dst: the samples read: $samples"; result=FAIL; fi
  printf '%-14s %-14s %-4s %s\n' "$w ($(name $z))" "$w2 ($(name $z2))" "$result" "$samples"
}
printf '%-14s %-14s %-4s %s\n' "saved by" "loaded by" "same" "samples"
for w in 4 2; do
  for z in 0 1 2 3; do job "save-w$w-z$z" "$w" "$z" save; done
  cmp -s "$work/save-w$w-z0.optimizer.safetensors" "$work/save-w$w-z1.optimizer.safetensors" ||
    fail "the optimizer state saved by $w processes differs with ZeRO and without"
  for z in 0 1 2 3; do
    targets=("3 3" "1 0")  # FSDP where nothing divides; one process, which never shards
    for z2 in 0 1 2; do
      (( z == 3 && z2 > 0 )) && continue  # an FSDP checkpoint loads into stage 0 or FSDP
      if (( w == 4 )); then targets+=("2 $z2"); else targets+=("3 $z2"); fi
    done
    (( w == 2 && z < 3 )) && targets+=("2 $(( (z + 1) % 3 ))")
    for t in "${targets[@]}"; do load_and_check "$w" "$z" $t; done
  done
done
# HSDP ("zero 4": FSDP within pairs, two replicas of them): only the first replica writes its rows,
# and the checkpoint loads under DDP and FSDP at other sizes; an FSDP checkpoint loads into HSDP.
job save-w4-z4 4 4 save
for to in "2 0" "3 3"; do load_and_check 4 4 $to; done
load_and_check 4 3 4 4
hsdp_ckpt=$(newest "$work/save-w4-z4.ckpt")
if [[ -n "$python" ]]; then
  "$python" - "$hsdp_ckpt" <<'PY' || fail "an HSDP checkpoint's second replica wrote rows"
import sys
from safetensors import safe_open
keys = {}
for r in range(4):
    with safe_open(f"{sys.argv[1]}/model_0.rank{r}.safetensors", "pt") as f:
        keys[r] = set(f.keys())
assert keys[0] and keys[1] and not keys[2] and not keys[3], keys
print("HSDP: ranks 0 and 1 wrote the rows, the second replica (ranks 2 and 3) none")
PY
fi
# tandem checkpoint: what a sharded checkpoint holds; an optimizer it does not hold is refused.
info=$("$tandem" checkpoint info "$work/save-w4-z1.ckpt")
grep -q "optimizer 0  AdamW, sharded, 4 file(s): loads at any world size" <<<"$info" &&
  grep -q "loader 0     epoch 0, 80 samples of it consumed" <<<"$info" || fail "tandem checkpoint info: $info"
if refused=$("$tandem" checkpoint consolidate "$work/save-w4-z1.ckpt" --optimizer 1 --out "$work/never" 2>&1) ||
   ! grep -q "holds 1 optimizer(s); there is no optimizer 1" <<<"$refused" || [[ -e "$work/never" ]]; then
  fail "consolidate --optimizer 1: $refused"
fi
# Under FSDP every rank wrote its rows (Note [Sharded checkpoints]): no file holds the whole model.
info=$("$tandem" checkpoint info "$work/save-w4-z3.ckpt")
grep -q "model 0      model_0.rank\*.safetensors, sharded in 4 files: 4 tensors, 200 elements" <<<"$info" &&
  grep -q "optimizer 0  AdamW, sharded, 4 file(s)" <<<"$info" || fail "tandem checkpoint info of an FSDP checkpoint: $info"
fsdp_ckpt=$(newest "$work/save-w4-z3.ckpt")
[[ ! -e "$fsdp_ckpt/model_0.safetensors" && -f "$fsdp_ckpt/model_0.rank3.safetensors" ]] ||
  fail "an FSDP checkpoint has a whole model file, or no rank 3 file: $(ls "$fsdp_ckpt")"
# A whole model file consolidates to itself, byte for byte.
cmp -s "$(newest "$work/save-w4-z0.ckpt")/model_0.safetensors" "$work/save-w4-z0.model.safetensors" ||
  fail "consolidate --model of a whole checkpoint is not its model file"
# The consolidated file is a plain safetensors file for Python: AdamW's state by parameter name,
# and the weights FSDP saved as rows a state dict that PyTorch's own module loads strictly.
if [[ -n "$python" ]]; then
  "$python" - "$work/save-w4-z3.model.safetensors" "$fsdp_ckpt" <<'PY' || fail "PyTorch cannot load the consolidated FSDP weights"
import sys, torch
from safetensors import safe_open
from safetensors.torch import load_file
state = load_file(sys.argv[1])
net = torch.nn.Sequential(torch.nn.Linear(9, 13), torch.nn.Tanh(), torch.nn.Linear(13, 5))
net.load_state_dict(state, strict=True)
# Each rank's file holds its rows: together, in rank order, they are the consolidated weights.
for name, whole in state.items():
    rows = []
    for r in range(4):
        with safe_open(f"{sys.argv[2]}/model_0.rank{r}.safetensors", "pt") as f:
            if name in f.keys():
                rows.append(f.get_tensor(name))
    assert torch.equal(torch.cat(rows), whole), name
print("PyTorch loads the consolidated FSDP weights strictly; the ranks' rows are their pieces:", sorted(state))
PY
  "$python" - "$work/save-w4-z1.optimizer.safetensors" <<'PY' || fail "python safetensors cannot read the consolidated file"
import json, sys
from safetensors import safe_open
with safe_open(sys.argv[1], "pt") as f:
    keys, meta = set(f.keys()), f.metadata()
names = [p for g in json.loads(meta["param_groups"]) for p in g["params"]]
assert meta["optimizer"] == "AdamW" and names == ["0.weight", "2.weight", "0.bias", "2.bias"], (meta, names)
assert keys == {f"{p}.{k}" for p in names for k in ("step", "exp_avg", "exp_avg_sq")}, sorted(keys)
print("python safetensors reads the consolidated AdamW state:", len(keys), "tensors")
PY
fi
[[ $status -eq 0 ]] && echo "checkpoints load at every world size, sharded or not, bit for bit; every sample of the epoch read once"
exit $status
