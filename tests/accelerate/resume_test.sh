#!/usr/bin/env bash
# resume_test.sh TANDEM ACCELERATOR_TEST NPROC K: exact resume. A job runs 2k batches straight; another
# runs k batches and saves its state; a third (new processes) loads it and runs k more. The
# parameters (bit patterns), the RNG draws and the samples each rank consumed must be identical.
set -eu
tandem="$1"; binary="$2"; nproc="$3"; k="$4"; python="${5:-}"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work  # tests/support/logs.sh: the logs are printed on failure
# K batches end in the second epoch, mid-epoch, on a synchronising batch (accumulation is 2)
export RESUME_K="$k" RESUME_DIR="$work/checkpoints"
# A phase that fails or hangs (bounded within ctest's 300 s for the three: the trap then prints
# its log, ctest's kill would not).
run() { RESUME_OUT="$work/$1" timeout -k 5 90 "$tandem" run --nproc-per-node "$nproc" -- "$binary" "--scenario=resume-phase-$2" \
          >"$work/$1.log" 2>&1 || { echo "FAIL: phase $2 failed (exit $?)"; exit 1; }; }
run straight 0
run first_half 1
ls "$RESUME_DIR"
run second_half 2
status=0
for ((r = 0; r < nproc; ++r)); do
  straight="$work/straight.rank$r"; first="$work/first_half.rank$r"; second="$work/second_half.rank$r"
  # parameters and RNG of the resumed run = the straight run's
  if ! diff <(head -2 "$straight") <(head -2 "$second") >/dev/null; then
    echo "FAIL: rank $r: parameters or RNG state differ after resume; the first differing words (< straight, > resumed):"
    diff <(head -2 "$straight" | tr ' ' '\n') <(head -2 "$second" | tr ' ' '\n') | head -n 12; status=1
  fi
  # samples: first half followed by second half = straight
  joined="$(sed -n 3p "$first" | cut -d' ' -f2-) $(sed -n 3p "$second" | cut -d' ' -f2-)"
  if [[ "$(sed -n 3p "$straight" | cut -d' ' -f2-)" != "$joined" ]]; then
    echo "FAIL: rank $r: the resumed run read other samples"; status=1
  fi
  echo "rank $r: $(sed -n 3p "$straight" | wc -w) samples, parameters $(head -1 "$straight" | wc -w) floats compared"
done
# The checkpoint's weights, read by Python's safetensors: bit for bit the first half's parameters.
if [[ -n "$python" ]]; then
  if "$python" - "$RESUME_DIR" "$work/first_half.rank0" <<'PY'
import glob, sys, struct
from safetensors.torch import load_file
ckpt = sorted(glob.glob(sys.argv[1] + "/checkpoint_*"))[-1]
tensors = load_file(ckpt + "/model_0.safetensors")
bits = []
for name in ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]:
    for v in tensors[name].flatten().tolist():
        bits.append(struct.unpack("<I", struct.pack("<f", v))[0])
expected = [int(b) for b in open(sys.argv[2]).readline().split()]
sys.exit(0 if bits == expected else 1)
PY
  then echo "python safetensors reads the checkpoint's weights bit for bit"; else echo "FAIL: python safetensors disagrees"; status=1; fi
fi
[[ $status -eq 0 ]] && echo "exact resume: parameters, RNG draws and data order identical on $nproc rank(s)"
exit $status
