#!/usr/bin/env python3
"""check_samples.py OUT N EPOCHS: every sample once in every epoch of an elastic run.

Reads fault_trainer's traces OUT/trace.a<round>.r<rank> (lines `resumed <step> ...`, `samples
<step> <epoch> <ids>`). A later round resumed from a checkpoint and did the steps after it again;
the steps that made the final weights are, for each step, those of the last round that did it.
Checks that those steps are 1..S without a gap, that each round began right after the step it
resumed from, and that each of the EPOCHS epochs holds each of the N samples exactly once.
Prints the rounds (world size, steps) and exits 1 with one line on the first violation."""
import collections
import glob
import os
import re
import sys


def fail(message):
    print(f"check_samples: FAIL: {message}")
    sys.exit(1)


def main():
    out, n, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rounds = collections.defaultdict(dict)  # round -> rank -> {step: (epoch, ids)}
    resumed = {}
    for path in glob.glob(os.path.join(out, "trace.a*.r*")):
        m = re.fullmatch(r"trace\.a(\d+)\.r(\d+)", os.path.basename(path))
        a, r = int(m.group(1)), int(m.group(2))
        steps = rounds[a].setdefault(r, {})
        with open(path) as f:
            for line in f:
                words = line.split()
                if words and words[0] == "resumed":
                    resumed[a] = int(words[1])
                elif words and words[0] == "fresh":
                    resumed[a] = 0
                elif words and words[0] == "samples":
                    steps[int(words[1])] = (int(words[2]), [int(w) for w in words[3:]])
    if not rounds:
        fail(f"no trace under {out}")
    lineage = {}  # step -> (round, epoch, ids of every rank)
    for a in sorted(rounds):
        ranks = rounds[a]
        world = len(ranks)
        if sorted(ranks) != list(range(world)):
            fail(f"round {a} has traces of ranks {sorted(ranks)}, not 0..{world - 1}")
        done = sorted(set().union(*[set(s) for s in ranks.values()]))
        start = resumed.get(a)
        if start is None:
            fail(f"round {a} says neither fresh nor resumed")
        if done and done[0] != start + 1:
            fail(f"round {a} resumed from step {start} but its first step is {done[0]}")
        print(f"round {a}: world {world}, resumed from step {start}, steps {done[0] if done else '-'}..{done[-1] if done else '-'}")
        for step in done:
            for r, steps in ranks.items():
                if step not in steps:
                    fail(f"round {a}: rank {r} has no samples of step {step}")
            epoch = {steps[step][0] for steps in ranks.values()}
            if len(epoch) != 1:
                fail(f"round {a}, step {step}: the ranks disagree on the epoch ({sorted(epoch)})")
            ids = [i for r in sorted(ranks) for i in ranks[r][step][1]]
            lineage[step] = (a, epoch.pop(), ids)
    steps = sorted(lineage)
    if steps != list(range(1, len(steps) + 1)):
        fail(f"the steps of the final weights are not 1..{len(steps)}")
    per_epoch = collections.defaultdict(collections.Counter)
    for step in steps:
        per_epoch[lineage[step][1]].update(lineage[step][2])
    if sorted(per_epoch) != list(range(epochs)):
        fail(f"epochs {sorted(per_epoch)} were trained, not 0..{epochs - 1}")
    for e in range(epochs):
        count = per_epoch[e]
        missing = [i for i in range(n) if count[i] == 0]
        twice = [i for i, c in count.items() if c > 1]
        if missing or twice or len(count) != n:
            fail(f"epoch {e}: samples missing {missing[:10]}, seen more than once {twice[:10]}")
    print(f"check_samples: ok: {len(steps)} steps over {len(rounds)} rounds; each of the {epochs} epochs saw "
          f"each of the {n} samples exactly once")


if __name__ == "__main__":
    main()
