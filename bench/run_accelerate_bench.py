#!/usr/bin/env python3
"""The Accelerator beside raw Tandem DDP, PyTorch DDP and Hugging Face accelerate (docs/benchmarks.md).

The same training step (forward, cross-entropy, backward, SGD with momentum) on the same model
and batch, 2 processes of 1 thread each on the same cores: Tandem's DDP written by hand, the
same loop through tandem::Accelerator (accumulate scope, backward, step, zero_grad), PyTorch's
DistributedDataParallel, and accelerate 1.16's Accelerator (its `accumulate`, `backward`,
prepared optimizer). Alternating order, median of repeats.

  .venv/bin/python bench/run_accelerate_bench.py [--repeats 5] [--steps 30]
Writes results/accelerate_bench/{runs.jsonl,summary.md}.
"""
import os

from harness import alternating, fmt, launch, parse_arguments, run_plan, spread

WORLD, BATCH = 2, 64
CONFIGS = [
    # label, impl, mode
    ("Tandem DDP", "tandem", "ddp"),
    ("Tandem Accelerator", "tandem", "accelerate"),
    ("PyTorch DDP", "pytorch", "ddp"),
    ("Python accelerate", "pytorch", "accelerate"),
]


def main():
    args, runs_path = parse_arguments(__doc__, "accelerate_bench", repeats=5, steps=30, models="mlp,cnn")
    plan = [(m, r, c) for m in args.models.split(",") for r, c in alternating(CONFIGS, args.repeats)]

    def run_one(item):
        model, repeat, (label, impl, mode) = item
        worker_args = ["--model", model, "--mode", mode, "--batch", str(BATCH), "--steps", str(args.steps),
                       "--warmup", str(args.warmup)]
        rec = launch(args.build, args.python, impl, WORLD, worker_args, 1, os.path.join(args.out_dir, "last.jsonl"))
        rec.update(label=label, repeat=repeat, samples_per_s=WORLD * BATCH / max(rec["rank_p50_s"]))
        return rec

    records = run_plan(plan, run_one, runs_path, lambda item, r: (
        f"{item[0]:4s} {item[2][0]:20s} repeat {item[1]}: {r['samples_per_s']:8.1f} samples/s"))

    lines = [f"{WORLD} processes x 1 thread, batch {BATCH} per process; medians over {args.repeats} repeats "
             "(min..max); throughput = global samples/s from the slowest rank's p50 step.\n",
             "| workload | configuration | samples/s | ÷ Tandem DDP | ÷ Python accelerate |", "|---|---|---|---|---|"]
    for model in args.models.split(","):
        by = {label: [r for r in records if r["model"] == model and r["label"] == label] for label, _, _ in CONFIGS}
        for label, _, _ in CONFIGS:
            rs = by[label]
            # ratios per repeat, so that drift of the machine cancels within a repeat
            def ratio(other):
                pairs = {r["repeat"]: r["samples_per_s"] for r in by[other]}
                return spread([r["samples_per_s"] / pairs[r["repeat"]] for r in rs])
            lines.append(f"| {model} | {label} | {fmt(spread([r['samples_per_s'] for r in rs]), '', 0)} | "
                         f"{fmt(ratio('Tandem DDP'))} | {fmt(ratio('Python accelerate'))} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
