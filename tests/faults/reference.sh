#!/usr/bin/env bash
# reference.sh TANDEM TRAINER DIR: the uninterrupted run the restart and checkpoint faults are
# judged against: 2 ranks, 20 steps, a checkpoint every 4, traces in DIR (trace.a0.r<rank>).
set -u
source "$(dirname "$0")/lib.sh"
tandem="$1"; trainer="$2"; dir="$3"
rm -rf "$dir"; mkdir -p "$dir"
start=$(now_ns)
run_job "$dir/launcher.log" 120 "$tandem" run --nproc-per-node 2 --log-dir "$dir/logs" -- \
  "$trainer" train --root "$dir/checkpoints" --out "$dir" --steps 20 --every 4
cat "$dir/launcher.log"
[[ $RC -eq 0 ]] || fail "the reference run failed (exit $RC)"
for r in 0 1; do
  [[ "$(head -1 "$dir/trace.a0.r$r")" == fresh ]] || fail "rank $r did not start afresh"
  [[ "$(grep -c '^step ' "$dir/trace.a0.r$r")" -eq 20 ]] || fail "rank $r did not take 20 steps"
done
# DDP keeps the ranks identical: a check of the reference itself.
compare_step "$dir/trace.a0.r1" "$dir/trace.a0.r0" final
echo "reference: 20 steps on 2 ranks in $(ms_between "$start" "$(now_ns)") ms, $(wc -w < <(trace_line "$dir/trace.a0.r0" final)) words a weights line"
