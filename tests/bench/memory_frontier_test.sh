#!/usr/bin/env bash
# memory_frontier_test.sh TANDEM FRONTIER_WORKER IN_MEMORY_CGROUP_SH: `tandem bench
# --memory-budget` over the tiny family at 2 processes, DDP and FSDP. Checked independently of the
# bench's own verdict: for each strategy the member it reports as largest trains under the budget
# and the member one larger is killed for memory, both re-run here through the same per-rank cgroup
# wrapper (bench/in_memory_cgroup.sh) in a cgroup of this test's own; and FSDP's largest is at
# least DDP's. The tiny family's members are about 200 MB apart (src/bench/frontier.cpp), so a fit
# does not change between runs. Exit 77 (skipped) without a writable memory cgroup, or under a
# sanitizer. No speed is judged.
set -u
tandem="$1"; worker="$2"; wrapper="$3"
source "$(dirname "$0")/../support/memory_cgroup.sh"
make_memory_cgroup tandem-frontier-test
work=$(mktemp -d); trap 'remove_memory_cgroup; rm -rf "$work"' EXIT
budget=1200M budget_bytes=$(( 1200 * 1024 * 1024 ))

timeout -k 5 150 "$tandem" bench --memory-budget "$budget" --scale tiny --nproc 2 --strategies ddp,fsdp \
  --peers off --out "$work/out" > "$work/bench.log" 2>&1
rc=$?
cat "$work/bench.log"
(( rc == 0 )) || { echo "FAIL: tandem bench --memory-budget exited $rc"; exit 1; }
[[ -s $work/out/results.md && -s $work/out/results.json ]] || { echo "FAIL: no results.md / results.json"; exit 1; }

# One line per strategy: STRATEGY LARGEST NEXT, and the shape flags of both members.
python3 - "$work/out/results.json" > "$work/rows" <<'PY' || { echo "FAIL: unreadable results.json"; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))
fam = r["family"]
def flags(i):
    m = fam[i]
    return ",".join(str(m[k]) for k in ("vocab", "context", "dim", "layers", "heads", "batch"))
for row in r["rows"]:
    largest = row["largest"]["index"] if row["largest"] else -1
    nxt = row["next"]["index"]
    print(row["strategy"], largest, nxt, flags(largest) if largest >= 0 else "-", flags(nxt) if nxt < len(fam) else "-")
PY
cat "$work/rows"

probe() {  # probe STRATEGY INDEX SHAPE(v,t,d,l,h,b) -> exit status under the budget; log $work/recheck-STRATEGY-INDEX.log
  IFS=, read -r v t d l h b <<<"$3"
  timeout -k 5 60 "$tandem" run --nproc-per-node 2 -- /bin/sh "$wrapper" "$cg_root" "$limit_file" "$budget_bytes" \
    "$worker" --strategy "$1" --vocab "$v" --context "$t" --dim "$d" --layers "$l" --heads "$h" --batch-size "$b" \
    --out "$work/recheck.json" > "$work/recheck-$1-$2.log" 2>&1
}

status=0
declare -A largest
while read -r strategy lo hi lo_shape hi_shape; do
  largest[$strategy]=$lo
  (( lo >= 0 )) || { echo "FAIL: $strategy: no member of the tiny family fits $budget"; status=1; continue; }
  [[ $hi_shape != - ]] || { echo "FAIL: $strategy: the whole tiny family fits $budget (the budget tests nothing)"; status=1; continue; }
  if probe "$strategy" "$lo" "$lo_shape"; then echo "ok: $strategy member $lo trains under $budget"
  else echo "FAIL: $strategy member $lo, reported as fitting, failed when re-run:"; tail -3 "$work/recheck-$strategy-$lo.log"; status=1; fi
  probe "$strategy" "$hi" "$hi_shape"; rc=$?
  # Killed by the kernel for the budget (SIGKILL from the cgroup's OOM killer), not failed otherwise.
  if (( rc != 0 )) && grep -q "failed with signal 9 (Killed)" "$work/recheck-$strategy-$hi.log"; then
    echo "ok: $strategy member $hi is killed for memory under $budget"
  else
    echo "FAIL: $strategy member $hi, reported as not fitting, exited $rc when re-run:"; tail -3 "$work/recheck-$strategy-$hi.log"; status=1
  fi
done < "$work/rows"
if [[ -n ${largest[ddp]:-} && -n ${largest[fsdp]:-} ]] && (( largest[fsdp] < largest[ddp] )); then
  echo "FAIL: FSDP's largest member (${largest[fsdp]}) is smaller than DDP's (${largest[ddp]})"; status=1
fi
(( status == 0 )) && echo "the memory frontier's largest members fit and the next ones do not, re-run under $budget per process"
exit $status
