#!/usr/bin/env python3
"""check_samples.py OUT N EPOCHS [WORLDS [REFERENCE]]: every sample once in every epoch of an elastic run.

Reads fault_trainer's traces OUT/trace.a<round>.r<rank> (lines `resumed <step> <checkpoint>`,
`samples <step> <epoch> <ids>`, `saved <step> <checkpoint>`, `saved-on-sigterm <step>
<checkpoint>`). A later round resumed from a checkpoint and did the steps after it again; the
steps that made the final weights are, for each step, those of the last round that did it.
Checks that each round resumed from a checkpoint written by the round those steps came from,
began right after its step, that the steps are 1..S without a gap, and that each of the EPOCHS
epochs holds each of the N samples exactly once; with WORLDS (e.g. 4,2,4), that the rounds had
those world sizes. With REFERENCE (the traces of an uninterrupted run, same seed, one round): every
epoch trained whole by one round of the reference's world size is, step by step and rank by rank,
the reference's epoch (the permutation a job of that size draws, split the same way). Prints the
rounds and exits 1 with one line on the first violation."""
import collections
import glob
import os
import re
import sys


def fail(message):
    print(f"check_samples: FAIL: {message}")
    sys.exit(1)


def read_traces(out):
    """round -> rank -> {step: (epoch, ids)}, the lines that start each round, who saved what."""
    rounds = collections.defaultdict(dict)
    resumed = {}  # round -> (step, checkpoint)
    saved_by = {}  # checkpoint -> round that wrote it
    for path in glob.glob(os.path.join(out, "trace.a*.r*")):
        m = re.fullmatch(r"trace\.a(\d+)\.r(\d+)", os.path.basename(path))
        a, r = int(m.group(1)), int(m.group(2))
        steps = rounds[a].setdefault(r, {})
        with open(path) as f:
            for line in f:
                words = line.split()
                start = None
                if words and words[0] == "resumed":
                    start = (int(words[1]), words[2])
                elif words and words[0] == "fresh":
                    start = (0, None)
                if start is not None:
                    if resumed.setdefault(a, start) != start:
                        fail(f"the ranks of round {a} began from different places: {resumed[a]} and {start}")
                elif words and words[0] in ("saved", "saved-on-sigterm"):
                    saved_by[words[2]] = a
                elif words and words[0] == "samples":
                    steps[int(words[1])] = (int(words[2]), [int(w) for w in words[3:]])
    return rounds, resumed, saved_by


def epochs_of(ranks):
    """epoch -> [(rank, ids) of each rank, step after step] of one round's traces."""
    out = collections.defaultdict(list)
    for step in sorted(set().union(*[set(s) for s in ranks.values()])):
        epoch = ranks[0][step][0]
        out[epoch].append([(r, ranks[r][step][1]) for r in sorted(ranks)])
    return out


def main():
    out, n, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rounds, resumed, saved_by = read_traces(out)
    if not rounds:
        fail(f"no trace under {out}")
    lineage = {}  # step -> (round, epoch, ids of every rank)
    for a in sorted(rounds):
        ranks = rounds[a]
        world = len(ranks)
        if sorted(ranks) != list(range(world)):
            fail(f"round {a} has traces of ranks {sorted(ranks)}, not 0..{world - 1}")
        done = sorted(set().union(*[set(s) for s in ranks.values()]))
        if a not in resumed:
            fail(f"round {a} says neither fresh nor resumed")
        start, checkpoint = resumed[a]
        if start > 0:
            # The checkpoint must be the one the lineage's round of that step wrote.
            if start not in lineage:
                fail(f"round {a} resumed from step {start}, which no earlier round did")
            writer = saved_by.get(checkpoint)
            if writer != lineage[start][0]:
                fail(f"round {a} resumed from {checkpoint}, written by round {writer}, but step {start} "
                     f"of the final weights is round {lineage[start][0]}'s")
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
    if len(sys.argv) > 4:
        worlds = [int(w) for w in sys.argv[4].split(",")]
        got = [len(rounds[a]) for a in sorted(rounds)]
        if got != worlds:
            fail(f"the rounds had world sizes {got}, not {worlds}")
    if len(sys.argv) > 5:
        ref_rounds, _, _ = read_traces(sys.argv[5])
        ref = epochs_of(ref_rounds[0])
        ref_world = len(ref_rounds[0])
        compared = []
        for e in range(epochs):
            steps_e = [step for step in steps if lineage[step][1] == e]
            owners = {lineage[step][0] for step in steps_e}
            if len(owners) != 1 or len(rounds[next(iter(owners))]) != ref_world:
                continue
            a = owners.pop()
            got = [[(r, rounds[a][r][step][1]) for r in sorted(rounds[a])] for step in steps_e]
            if got != ref[e]:
                fail(f"epoch {e} (round {a}, world {ref_world}) is not the epoch an uninterrupted job of that size draws")
            compared.append(e)
        if not compared:
            fail("no epoch was trained whole by one round of the reference's world size")
        print(f"check_samples: epochs {compared}, each trained whole by one round, are the uninterrupted run's, "
              "rank by rank")
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
