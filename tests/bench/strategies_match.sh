#!/usr/bin/env bash
# strategies_match.sh WORKER PEER PYTHON: bench/peer.py's STRATEGIES says what Tandem's strategy
# table (src/bench/strategies.cpp, printed by `tandem-bench-worker --list-strategies`) says: the
# same names in the same order, each with the same launch (alone, replicas, ranks) and the same
# answer to "does the PyTorch peer measure it". Neither needs torch to answer.
set -euo pipefail
worker="$1"; peer="$2"; python="$3"
table=$("$worker" --list-strategies)
peers=$("$python" "$peer" --list-strategies)
"$python" - "$table" "$peers" <<'PY'
import json, sys

table = [json.loads(line) for line in sys.argv[1].splitlines()]
peer = json.loads(sys.argv[2])
ours = {e["name"]: {"launch": e["launch"], "pytorch": e["pytorch"]} for e in table}
errors = []
if list(ours) != list(peer):
    errors.append(f"names differ: the table has {list(ours)}, peer.py {list(peer)}")
for name in ours.keys() & peer.keys():
    if ours[name] != peer[name]:
        errors.append(f"{name}: the table says {ours[name]}, peer.py {peer[name]}")
for e in table:  # the table's own consistency: a peer named is one peer.py measures
    if e["peer"] and not ours.get(e["peer"], {}).get("pytorch"):
        errors.append(f"{e['name']}: its peer {e['peer']!r} is not a strategy the PyTorch peer measures")
    for twin in e["comm"].values():
        if twin and twin not in ours:
            errors.append(f"{e['name']}: its communication figures come from {twin!r}, which the table lacks")
for line in errors:
    print("FAILED:", line)
if errors:
    sys.exit(1)
print(f"strategies_match: {len(table)} strategies, the same in peer.py and the table")
PY
