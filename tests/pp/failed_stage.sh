#!/usr/bin/env bash
# failed_stage.sh TANDEM PIPELINE_TEST SCENARIO MICROBATCH: stage 1 of a 4-stage pipeline raises in
# the forward of MICROBATCH. The job ends within 30 s with a non-zero exit; stage 1's own line is
# there, and every other stage's line leads with it (Note [The first failed stage] in
# src/pp/stage.cpp), whichever rank the launcher reports first: its neighbours fail next, on
# connections stage 1's exit closed. A stage that fails after the store's host (rank 0) has exited
# cannot read it: its line is then its own. Either way a stage's own part names the stage, the
# microbatch and the peer it lost, whether it failed in an action or in a step's batched exchange
# of messages (the shapes first, then the values: Note [Shapes before values] in
# src/pp/schedule.cpp). The own part is checked on every line, so the check does not depend on
# which rank exits first.
set -u
tandem="$1"; binary="$2"; scenario="$3"; microbatch="$4"
source "$(dirname "$0")/../support/logs.sh"
scratch_dir work
timeout -k 5 30 "$tandem" run --nproc-per-node 4 -- "$binary" --scenario="$scenario" > "$work/out" 2>&1
rc=$?
tail -n 12 "$work/out"
if [[ $rc -eq 0 || $rc -eq 124 || $rc -eq 137 ]]; then echo "FAIL: exit $rc (0: succeeded; 124/137: hung)"; exit 1; fi
grep -q "tandem run: job failed: rank [0-3]" "$work/out" || { echo "FAIL: no 'job failed' line from the launcher"; exit 1; }
first="pp: stage 1 failed in the forward of microbatch $microbatch: injected failure"
own_pattern="^pp: stage [0-3] failed (in the (forward|backward) of microbatch [0-9]+: .*(recv|send) .* (from|to) rank [0-3]|(sending|receiving) the (activation|gradient) of microbatch [0-9]+ (to|from) rank [0-3]|exchanging a step.s messages \(.*(to|from) rank [0-3])"
lines=$(grep -E ": rank [0-3]: pp: " "$work/out")
grep -qE "^\[rank1\]: .*: rank 1: $first\$" <<<"$lines" || { echo "FAIL: stage 1 did not report: $first"; exit 1; }
while IFS= read -r line; do
  [[ "$line" == *": rank 1: $first" ]] && continue
  own="${line#*: rank [0-3]: }"
  if [[ "$own" == "$first (then "* ]]; then own="${own#"$first (then "}"; own="${own%)}"; fi
  grep -qE "$own_pattern" <<<"$own" || { echo "FAIL: this stage's part names no stage, microbatch and lost peer: $own"; exit 1; }
done <<<"$lines"
echo "failed_stage: ok, $(wc -l <<<"$lines") stage line(s): $(grep -cF ": $first" <<<"$lines") lead with stage 1's failure"
