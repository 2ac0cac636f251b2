#!/bin/bash
# `tandem plan` end to end: an 8-billion-parameter model planned with the process unable to map
# even a tenth of its weights (ulimit -v), the table, --json (one object per configuration, only
# JSON on stdout) and --out's files; a profile written by --show-profile and read back.
# usage: plan_cli.sh TANDEM PYTHON
set -euo pipefail
tandem=$1 python=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 2 GiB of address space: Llama 3 8B's weights alone are 32 GB in float32. (Not under a
# sanitizer: ASan reserves terabytes of shadow address space before main.)
limit=2097152
[[ -n "${TANDEM_TEST_INSTRUMENTED:-}" ]] && limit=unlimited
start=$(date +%s%N)
(ulimit -v $limit; "$tandem" plan --model llama3-8b --out "$work/out") > "$work/table.txt" \
  || fail "tandem plan --model llama3-8b failed under ulimit -v: $(cat "$work/table.txt")"
echo "planned llama3-8b in $(( ($(date +%s%N) - start) / 1000000 )) ms"
grep -q '^| 1 | ' "$work/table.txt" || fail "no configuration in the table: $(cat "$work/table.txt")"
grep -q 'configurations fit' "$work/table.txt" || fail "no summary line"
for f in plan.md plan.jsonl; do [ -s "$work/out/$f" ] || fail "--out wrote no $f"; done
if command -v gnuplot >/dev/null; then [ -s "$work/out/plan.png" ] || fail "gnuplot is here but no plan.png"; fi

(ulimit -v $limit; "$tandem" plan --model llama3-70b --nodes 8 --batch 64 --json) > "$work/plan.jsonl"
"$python" - "$work/plan.jsonl" "$work/table.txt" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]  # every line one object: nothing else printed
assert len(rows) > 100, len(rows)
fit = [r for r in rows if r["fits"]]
assert fit, "nothing fits 70B on 64 H100s"
for r in rows:
    assert r["dp"] * r["tp"] * r["pp"] == 64, r
    assert r["fits"] == (r["refusal"] == ""), r
    if "memory_bytes" in r:
        m = r["memory_bytes"]
        parts = sum(m[k] for k in ("weights", "gradients", "optimizer", "activations", "buffers", "runtime"))
        assert abs(parts - m["total"]) <= 1e-6 * m["total"], r
        s = r["step_s"]
        assert abs(s["compute"] + s["exposed_comm"] + s["bubble"] - s["total"]) <= 1e-9 * s["total"], r
steps = [r["step_s"]["total"] for r in fit]
assert steps == sorted(steps), "fits are not fastest first"
print(f"llama3-70b on 64 H100s: {len(fit)} of {len(rows)} fit; fastest {fit[0]['configuration']}")
PY

"$tandem" plan --show-profile h100-8x > "$work/mine.json"
sed -i 's/"devices_per_node": 8/"devices_per_node": 4/' "$work/mine.json"
grep -q '"devices_per_node": 4' "$work/mine.json" || fail "--show-profile did not print an editable object: $(head -c 200 "$work/mine.json")"
"$tandem" plan --model llama3-8b --profile "$work/mine.json" --json | "$python" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
assert rows and all(r["dp"] * r["tp"] * r["pp"] == 4 for r in rows), "the edited profile was not read"'
echo "ok"
