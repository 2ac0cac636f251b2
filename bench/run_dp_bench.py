#!/usr/bin/env python3
"""DataParallel beside DDP and a single device, on the same CPU cores (docs/benchmarks.md).

Same global batch everywhere (128): one device with 2 threads; Tandem DDP and PyTorch DDP with
2 ranks of 64, 1 thread each; Tandem DataParallel (replicate and persistent) with 2 CPU replicas
of 64 and 2 threads in all; PyTorch's nn.DataParallel, which on a machine without GPUs runs the
module as is (so it is the single-device loop in Python). Alternating order, median of repeats.
The transformer workload is left out: its input is sequence-first, and DataParallel scatters and
gathers along one dimension (dim 0 here, as PyTorch's default).

  .venv/bin/python bench/run_dp_bench.py [--repeats 3] [--steps 15]
Writes results/dp_bench/{runs.jsonl,summary.json,summary.md}.
"""
import json
import os

from harness import alternating, fmt, launch, parse_arguments, run_plan, spread
GLOBAL_BATCH = 128

CONFIGS = [
    # label, impl, mode, world, threads, per-process batch
    ("single device", "tandem", "plain", 1, 2, GLOBAL_BATCH),
    ("Tandem DDP", "tandem", "ddp", 2, 1, GLOBAL_BATCH // 2),
    ("Tandem DP replicate", "tandem", "dp_replicate", 1, 2, GLOBAL_BATCH),
    ("Tandem DP persistent", "tandem", "dp_persistent", 1, 2, GLOBAL_BATCH),
    ("PyTorch DDP", "pytorch", "ddp", 2, 1, GLOBAL_BATCH // 2),
    ("PyTorch DataParallel", "pytorch", "dp", 1, 2, GLOBAL_BATCH),
]


def main():
    args, runs_path = parse_arguments(__doc__, "dp_bench", repeats=3, steps=15, models="mlp,cnn")
    plan = [(m, r, c) for m in args.models.split(",") for r, c in alternating(CONFIGS, args.repeats)]

    def run_one(item):
        model, repeat, (label, impl, mode, world, threads, batch) = item
        worker_args = ["--model", model, "--mode", mode, "--batch", str(batch), "--steps", str(args.steps),
                       "--warmup", str(args.warmup)]
        rec = launch(args.build, args.python, impl, world, worker_args, threads, os.path.join(args.out_dir, "last.jsonl"))
        rec.update(label=label, repeat=repeat, global_samples_per_s=GLOBAL_BATCH / max(rec["rank_p50_s"]))
        return rec

    records = run_plan(plan, run_one, runs_path, lambda item, r: (
        f"{item[0]:4s} {item[2][0]:22s} repeat {item[1]}: {r['global_samples_per_s']:8.1f} samples/s"))

    summary, lines = {}, [
        f"Global batch {GLOBAL_BATCH}, 2 CPU cores; medians over {args.repeats} repeats (min..max); "
        "throughput = global samples/s (slowest rank's p50 step).\n",
        "| workload | configuration | samples/s | ÷ Tandem DDP | step p50 (ms) | memory per device (MB, primary / other) |",
        "|---|---|---|---|---|---|"]
    for model in args.models.split(","):
        by = {}
        for r in records:
            if r["model"] == model:
                by.setdefault(r["label"], {})[r["repeat"]] = r
        reps = sorted(by["Tandem DDP"])
        summary[model] = {}
        for label, *_ in CONFIGS:
            tput = spread([by[label][k]["global_samples_per_s"] for k in reps])
            ratio = spread([by[label][k]["global_samples_per_s"] / by["Tandem DDP"][k]["global_samples_per_s"] for k in reps])
            step = spread([max(by[label][k]["rank_p50_s"]) * 1e3 for k in reps])
            mem = by[label][reps[0]].get("replica_bytes") or []
            summary[model][label] = dict(samples_per_s=tput, ratio_vs_tandem_ddp=ratio, step_ms=step, replica_bytes=mem)
            mem_text = f"{mem[0] / 1e6:.1f} / {mem[1] / 1e6:.1f}" if len(mem) >= 2 else "-"
            lines.append(f"| {model} | {label} | {fmt(tput, digits=0)} | {fmt(ratio)} | {fmt(step, digits=1)} | {mem_text} |")
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
