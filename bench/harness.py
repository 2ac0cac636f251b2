"""The one harness every benchmark orchestrator uses: launch a measurement through `tandem run`,
walk a plan with progress and an ETA, summarise repeats as median and min..max. Stdlib only."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_arguments(description, name, repeats, steps, models, extra=None):
    """The flags every orchestrator takes; `extra(parser)` adds its own. Creates --out-dir and
    returns (args, path of runs.jsonl)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--models", default=models)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "results", name))
    if extra:
        extra(ap)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    return args, os.path.join(args.out_dir, "runs.jsonl")


def launch(build, python, impl, world, worker_args, threads, out):
    """Runs one measurement (Tandem's tandem_ddp_bench or the PyTorch peer) under `tandem run`
    and returns the JSON record rank 0 appended to `out`."""
    if os.path.exists(out):
        os.remove(out)
    worker = ([os.path.join(build, "bin", "tandem_ddp_bench")] if impl == "tandem"
              else [python, os.path.join(ROOT, "bench", "ddp_bench_peer.py")])
    cmd = ([os.path.join(build, "bin", "tandem"), "run", "--nproc-per-node", str(world), "--"] + worker +
           worker_args + ["--threads", str(threads), "--out", out])
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-3000:])
        raise SystemExit(f"benchmark run failed: {' '.join(cmd)}")
    with open(out) as f:
        return json.loads(f.read().strip().splitlines()[-1])


def run_plan(plan, run_one, runs_path, describe):
    """plan: items; run_one(item) -> record; describe(item, record) -> progress text.
    Appends every record to runs_path (JSON lines) and returns them."""
    open(runs_path, "w").close()
    records, started = [], time.time()
    for i, item in enumerate(plan, 1):
        record = run_one(item)
        records.append(record)
        with open(runs_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        eta = (time.time() - started) / i * (len(plan) - i)
        print(f"[{i}/{len(plan)}] {describe(item, record)}  (eta {eta / 60:.1f} min)", flush=True)
    return records


def alternating(configs, repeats):
    """Each repeat runs every configuration once; odd repeats in reverse order, so drift in the
    machine's speed hits every configuration alike."""
    return [(r, c) for r in range(repeats) for c in (configs if r % 2 == 0 else configs[::-1])]


def spread(values):
    return dict(median=statistics.median(values), min=min(values), max=max(values), n=len(values))


def fmt(s, unit="", digits=2):
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}..{s['max']:.{digits}f})"
