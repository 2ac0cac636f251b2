#!/usr/bin/env bash
# bench_smoke.sh TANDEM PYTHON [strategies|backends|tp|pp]: `tandem bench` end to end with the tiny
# presets and two steps. `strategies` (the default): the report files appear, results.md holds a
# row for every configured (model, strategy, world) and for each PyTorch peer, `tandem report`
# re-renders the same table from results.json, and `tandem report A B` compares a run with
# itself at 1.00. `backends`: --backends gloo,mpi gives both rows, the sweep and the "Gloo vs MPI"
# table. `tp`: the README's tensor-parallel comparison (tp and fsdp+tp beside ddp and PyTorch's
# parallelize_module) gives their rows, the TP collectives' table with counts and bytes, the
# recommendation's account of TP, and tp at 4 (2 heads) as not measured. `pp`: `--strategies pp`
# (every pipeline schedule beside torch.distributed.pipelining's) at 2 and 3 ranks gives the
# pipeline table (each rank's bubble beside the theory's, the activations each held), 1F1B's
# activations against GPipe's, the recommendation's account of the bubble, and interleaved at 3
# (6 stages of 3 blocks) as not measured. Four ctest tests, so that they run side by side. Figures are never judged: no speed threshold here.
set -euo pipefail
tandem="$1"; python="$2"; part="${3:-strategies}"
[[ $part == strategies || $part == backends || $part == tp || $part == pp ]] ||
  { echo "usage: bench_smoke.sh TANDEM PYTHON [strategies|backends|tp|pp]" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/../support/logs.sh"
scratch_dir out  # on failure, every measurement's log is printed before the folder goes

# require_lines MD WHAT PATTERN...: each extended regex matches a line of MD, or MD is printed and
# the test fails naming WHAT and the pattern.
require_lines() {
  local md="$1" what="$2" row; shift 2
  for row in "$@"; do
    grep -qE "$row" "$md" || { cat "$md"; echo "FAIL: $what: no line matching $row"; exit 1; }
  done
}

if [[ $part == strategies ]]; then
models=(small large)  # medium (the CNN) is in bench.worker.records; all three took 88 s here
strategies=(single dp-replicate dp-persistent ddp accelerate)

"$tandem" bench --models small,large --nproc 1,2 --scale tiny --steps 2 --warmup 1 --min-seconds 0.02 --repeats 1 \
  --python "$python" --peers on --project 4x1,8x4 --out "$out/run" | tee "$out/log"

for f in results.json results.md throughput.png memory.png breakdown.png; do
  [[ -s "$out/run/$f" ]] || { echo "FAIL: $out/run/$f is missing or empty"; exit 1; }
done
head -c 8 "$out/run/throughput.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" \
  || { echo "FAIL: throughput.png is not a PNG"; exit 1; }

# Every configured row, with a number in its samples/s column, in its model's block of the
# performance table.
rows_of() {  # rows_of MODEL -> that model's lines of the performance table
  sed -n '/^## Performance/,/^Gradient:/p' "$out/run/results.md" |
    awk -v m="$1" '/^\| [a-z]+ \(/ { current = $2 } current == m'
}
missing=0
for model in "${models[@]}"; do
  for s in "${strategies[@]}"; do
    label="Tandem $s"; [[ $s == accelerate ]] && label="Tandem Accelerator"
    world=2; [[ $s == single ]] && world=1
    n=$(rows_of "$model" | grep -cE "^\| [^|]* \| $label \| $world \| [0-9]" || true)
    if [[ $n -ne 1 ]]; then echo "FAIL: no row for $model $label x$world"; missing=1; fi
  done
  for label in "PyTorch single|1" "PyTorch ddp|2" "HF accelerate|2"; do
    n=$(rows_of "$model" | grep -cE "^\| [^|]* \| ${label%|*} \| ${label#*|} \| [0-9]" || true)
    if [[ $n -ne 1 ]]; then echo "FAIL: no row for $model ${label%|*} x${label#*|}"; missing=1; fi
  done
  grep -q "^- \*\*$model: " "$out/run/results.md" || { echo "FAIL: no recommendation for $model"; missing=1; }
done
# On CPU torch.nn.DataParallel cannot replicate: said so, not silently dropped.
grep -q "pytorch dp (2 devices): torch.nn.DataParallel" "$out/run/results.md" \
  || { echo "FAIL: the unsupported torch.nn.DataParallel peer is not reported"; missing=1; }
grep -q "^### Validation" "$out/run/results.md" || { echo "FAIL: no projection validation"; missing=1; }
grep -qE "^\| (small|medium|large) \| 8 × 4 \|" "$out/run/results.md" || { echo "FAIL: no 8x4 projection"; missing=1; }
[[ $missing -eq 0 ]] || { cat "$out/run/results.md"; exit 1; }

# tandem report DIR: the same table from results.json alone.
cp "$out/run/results.md" "$out/first.md"
rm "$out/run/results.md" "$out/run/throughput.png"
"$tandem" report "$out/run" > "$out/rerendered.md"
cmp "$out/first.md" "$out/run/results.md" || { echo "FAIL: tandem report rendered another results.md"; exit 1; }
cmp "$out/first.md" "$out/rerendered.md" || { echo "FAIL: tandem report printed another table"; exit 1; }
[[ -s "$out/run/throughput.png" ]] || { echo "FAIL: tandem report drew no throughput.png"; exit 1; }

# tandem report A B: a run against itself is 1.00 everywhere.
"$tandem" report "$out/run" "$out/run" --out "$out/compare.md" > /dev/null
rows=$(grep -cE "^\| (small|medium|large) \| .* \| 1\.00 \|" "$out/compare.md" || true)
others=$(grep -E "^\| (small|medium|large) \| " "$out/compare.md" | grep -vcE "\| 1\.00 \|" || true)
[[ $rows -gt 0 && $others -eq 0 ]] || { cat "$out/compare.md"; echo "FAIL: self-comparison is not 1.00 on every row"; exit 1; }

fi

# --backends gloo,mpi (where this build has MPI and mpirun is on PATH): DDP on both, the sweep on
# both, the "Gloo vs MPI" table. Small: 9 measurements of the tiny MLP, no peers.
if [[ $part == backends ]] && command -v mpirun > /dev/null; then
  if "$tandem" bench --models small --strategies ddp --nproc 2 --scale tiny --steps 2 --warmup 1 --min-seconds 0 --repeats 1 \
       --peers off --backends gloo,mpi --sweep --sweep-min-bytes 65536 --sweep-max-bytes 262144 \
       --out "$out/mpi" > "$out/mpi.log" 2>&1; then
    md="$out/mpi/results.md"
    require_lines "$md" "--backends gloo,mpi" '\| Tandem ddp \(gloo\) \| 2 \| [0-9]' '\| Tandem ddp \(mpi\) \| 2 \| [0-9]' \
      '\| small \| 2 \| ddp step \| [0-9]' "\\| small \\| 2 \\| gradient all-reduce \\(DDP's buckets\\) \\| [0-9]" \
      '\| 64 KiB \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|' '\| 256 KiB \| [0-9.]+ \|'
  elif grep -q "has no MPI backend" "$out/mpi.log"; then
    echo "bench_smoke: --backends mpi skipped: this build has no MPI backend"
  else
    echo "FAIL: tandem bench --backends gloo,mpi"; exit 1  # the logs follow (scratch_dir)
  fi
fi
if [[ $part == tp ]]; then
  "$tandem" bench --models large --strategies single,ddp,fsdp,tp,fsdp+tp --nproc 2,4 --scale tiny --steps 2 --warmup 1 \
    --min-seconds 0.02 --repeats 1 --python "$python" --peers on --out "$out/tp" | tee "$out/tp.log"
  md="$out/tp/results.md"
  require_lines "$md" "tandem bench --strategies ...,tp,fsdp+tp" \
    '\| Tandem TP \| 2 \| [0-9]' \
    '\| Tandem FSDP\+TP \| 4 \| [0-9]' \
    '\| PyTorch TP \| 2 \| [0-9]' \
    '\| PyTorch FSDP2\+TP \| 4 \| [0-9]' \
    '^\| large \| Tandem TP \| 2 \| 2 \| [0-9.]+ \| [1-9][0-9]* \| [0-9.]+ \| [0-9.]+ \| [0-9]+ % \|' \
    '^\| large \| Tandem FSDP\+TP \| 4 \| 2 \| [0-9.]+ \| [1-9][0-9]* \|' \
    '^- \*\*large: .*fsdp\+tp [0-9.]+x( one device)? \(TP group of 2: [0-9]+ % of its step blocked in [1-9][0-9]* TP collectives' \
    '^- tandem tp \(4 devices\): tp cuts the GPT.s 2 heads and 128 classes over 4 ranks'
  echo "bench_smoke: tp ok"
fi
if [[ $part == pp ]]; then
  "$tandem" bench --models large --strategies pp --nproc 2,3 --scale tiny --steps 2 --warmup 1 --min-seconds 0.02 \
    --repeats 1 --python "$python" --peers on --out "$out/pp" | tee "$out/pp.log"
  md="$out/pp/results.md"
  require_lines "$md" "tandem bench --strategies pp" \
    '^\| large \| Tandem PP GPipe \| 2 \| 4 \| [0-9.]+ \| 20 % \| [0-9]+ % / [0-9]+ % \| [0-9.]+ / [0-9.]+ \|$' \
    '^\| large \| Tandem PP 1F1B \| 3 \| 6 \| [0-9.]+ \| 25 % \| [0-9]+ % / [0-9]+ % / [0-9]+ % \| [0-9.]+ / [0-9.]+ / [0-9.]+ \|$' \
    '^\| large \| Tandem PP interleaved 1F1B \| 2 \| 4 \(2 stages per rank\) \| [0-9.]+ \| 11 % \|' \
    '^\| large \| PyTorch PP interleaved 1F1B \| 2 \| 4 \(2 stages per rank\) \| [0-9.]+ \| 11 % \| [0-9]+ % / [0-9]+ % \| – / – \|$' \
    '^\| large \| PyTorch PP GPipe \| 3 \| 6 \| [0-9.]+ \| 25 % \|' \
    '^- large, Tandem PP 1F1B at 2 devices, 4 microbatches: activations held on stage 0 [0-9.]+ MiB against GPipe.s [0-9.]+ \([0-9]+ %\), on stage 1' \
    '^- tandem pp-interleaved \(3 devices\): pp-interleaved: the tiny GPT.s 3 blocks cannot fill 6 pipeline stages'
  # The recommendation gives both schedules at 3 ranks their bubble, wherever the timings put them
  # (the winner, the best of the wider world, or a row after it: a run under load changes which).
  accounts=$(grep -E '^- \*\*large: ' "$md" |
             grep -oE '\(pipeline of 3, 6 microbatches: up to [0-9]+ % of a step blocked on its neighbours, 25 % in theory\)' | wc -l)
  [[ $accounts -eq 2 ]] || { cat "$md"; echo "FAIL: the recommendation gives $accounts pipelines of 3 their bubble, not 2"; exit 1; }
  echo "bench_smoke: pp ok"
fi
if [[ $part == strategies ]]; then
  echo "bench_smoke: ok ($(grep -cE '^\| [^|]* \| (Tandem|PyTorch|HF)' "$out/run/results.md") rows)"
elif [[ $part == backends ]]; then
  command -v mpirun > /dev/null || echo "bench_smoke: --backends mpi skipped: no mpirun on PATH"
  echo "bench_smoke: backends ok"
fi
