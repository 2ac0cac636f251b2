#!/usr/bin/env bash
# failed_stage.sh TANDEM PIPELINE_TEST: stage 1 of a 4-stage pipeline raises in the forward of
# microbatch 2. The job ends within 30 s with a non-zero exit; stage 1's own line is there, and
# every other stage's line leads with it (Note [The first failed stage] in src/pp/stage.cpp),
# whichever rank the launcher reports first: its neighbours fail next, on connections stage 1's
# exit closed. A stage that fails after the store's host (rank 0) has exited cannot read it: its
# line is then its own, and must name the peer it lost.
set -u
tandem="$1"; binary="$2"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
timeout -k 5 30 "$tandem" run --nproc-per-node 4 -- "$binary" --scenario=stage-1-raises > "$work/out" 2>&1
rc=$?
tail -n 12 "$work/out"
if [[ $rc -eq 0 || $rc -eq 124 || $rc -eq 137 ]]; then echo "FAIL: exit $rc (0: succeeded; 124/137: hung)"; exit 1; fi
grep -q "tandem run: job failed: rank [0-3]" "$work/out" || { echo "FAIL: no 'job failed' line from the launcher"; exit 1; }
first="pp: stage 1 failed in the forward of microbatch 2: injected failure"
lines=$(grep -E ": rank [0-3]: pp: " "$work/out")
grep -qE "^\[rank1\]: .*: rank 1: $first\$" <<<"$lines" || { echo "FAIL: stage 1 did not report: $first"; exit 1; }
others=$(grep -vF ": $first" <<<"$lines" || true)
if [[ -n "$others" ]] && grep -vE ": rank [0-3]: pp: stage [0-3] failed in the (forward|backward) of microbatch [0-9]+: (recv|send) .* (from|to) rank [0-3]" <<<"$others"; then
  echo "FAIL: the line above neither leads with stage 1's failure nor names the peer it lost"; exit 1
fi
echo "failed_stage: ok, $(wc -l <<<"$lines") stage line(s): $(grep -cF ": $first" <<<"$lines") lead with stage 1's failure"
