#!/usr/bin/env python3
"""Tandem DDP against PyTorch DDP, side by side on this machine (docs/benchmarks.md).

For each workload and repeat, runs every configuration once, alternating the order between
repeats (ours first, then theirs first) so that drift in the machine's speed hits both alike.
Reports medians over repeats with the min..max spread, and ratios measured within one run.
Stdlib only; the binaries and the peer script do the measuring.

  .venv/bin/python bench/run_ddp_bench.py [--repeats 5] [--steps 20] [--models mlp,cnn,transformer]
Writes results/ddp_bench/{runs.jsonl,summary.json,summary.md,throughput.png}.
"""
import json
import os
import shutil
import subprocess

from harness import alternating, fmt, launch, parse_arguments, run_plan, spread


def configs(model):
    # (label, impl, mode, world, extra flags)
    return [
        ("tandem ddp w2", "tandem", "ddp", 2, []),
        ("pytorch ddp w2", "pytorch", "ddp", 2, []),
        ("tandem ddp w1", "tandem", "ddp", 1, []),
        ("pytorch ddp w1", "pytorch", "ddp", 1, []),
        ("tandem plain w1", "tandem", "plain", 1, []),
        ("pytorch plain w1", "pytorch", "plain", 1, []),
        ("tandem no_sync w2", "tandem", "no_sync", 2, []),
        ("pytorch no_sync w2", "pytorch", "no_sync", 2, []),
        ("tandem ddp w2 view", "tandem", "ddp", 2, ["--bucket-view"]),
        ("tandem allreduce w2", "tandem", "allreduce", 2, []),
    ]


def main():
    args, runs_path = parse_arguments(__doc__, "ddp_bench", repeats=5, steps=20, models="mlp,cnn,transformer",
                                      extra=lambda ap: ap.add_argument("--batch", type=int, default=64))

    models = args.models.split(",")
    plan = [(model, repeat, config) for model in models for repeat, config in alternating(configs(model), args.repeats)]

    def run_one(item):
        model, repeat, (label, impl, mode, world, extra) = item
        worker_args = ["--model", model, "--mode", mode, "--batch", str(args.batch), "--steps", str(args.steps),
                       "--warmup", str(args.warmup)] + extra
        record = launch(args.build, args.python, impl, world, worker_args, 1, os.path.join(args.out_dir, "last.jsonl"))
        record.update(label=label, repeat=repeat)
        return record

    records = run_plan(plan, run_one, runs_path, lambda item, r: (
        f"{item[0]:11s} {item[2][0]:20s} repeat {item[1]}: p50 {r['p50_s'] * 1e3:8.2f} ms, "
        f"{r['samples_per_s_per_rank']:8.1f} samples/s/rank"))

    summary = summarize(records, models)
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    table = markdown(summary, args)
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write(table)
    print(table)
    plot(summary, args.out_dir)


def summarize(records, models):
    out = {}
    for model in models:
        by = {}
        for r in records:
            if r["model"] == model:
                by.setdefault(r["label"], {})[r["repeat"]] = r
        repeats = sorted(by["tandem ddp w2"])

        def metric(label, key):
            return spread([by[label][k][key] for k in repeats])

        def ratio(fn):
            return spread([fn(k) for k in repeats])

        tp = lambda label, k: by[label][k]["samples_per_s_per_rank"]
        p50 = lambda label, k: by[label][k]["p50_s"]
        ar = by["tandem allreduce w2"]
        n = 2
        m = dict(
            throughput={label: metric(label, "samples_per_s_per_rank") for label in by if "allreduce" not in label},
            p50_ms={label: spread([by[label][k]["p50_s"] * 1e3 for k in repeats]) for label in by},
            p95_ms={label: spread([by[label][k]["p95_s"] * 1e3 for k in repeats]) for label in by},
            ratio_vs_pytorch_w2=ratio(lambda k: tp("tandem ddp w2", k) / tp("pytorch ddp w2", k)),
            ratio_vs_pytorch_w1=ratio(lambda k: tp("tandem ddp w1", k) / tp("pytorch ddp w1", k)),
            plain_loop_ratio_vs_pytorch=ratio(lambda k: tp("tandem plain w1", k) / tp("pytorch plain w1", k)),
            scaling_efficiency_tandem=ratio(lambda k: tp("tandem ddp w2", k) / tp("tandem ddp w1", k)),
            scaling_efficiency_pytorch=ratio(lambda k: tp("pytorch ddp w2", k) / tp("pytorch ddp w1", k)),
            ddp_w1_vs_plain=ratio(lambda k: tp("tandem ddp w1", k) / tp("tandem plain w1", k)),
            exposed_comm_ms_tandem=ratio(lambda k: (p50("tandem ddp w2", k) - p50("tandem no_sync w2", k)) * 1e3),
            exposed_comm_ms_pytorch=ratio(lambda k: (p50("pytorch ddp w2", k) - p50("pytorch no_sync w2", k)) * 1e3),
            peak_rss_mb_ddp_view_w2=spread([max(by["tandem ddp w2 view"][k]["rank_peak_rss_mb"]) for k in repeats]),
            peak_rss_mb_plain_w1=spread([max(by["tandem plain w1"][k]["rank_peak_rss_mb"]) for k in repeats]),
            peak_rss_ratio_view_vs_plain=ratio(lambda k: max(by["tandem ddp w2 view"][k]["rank_peak_rss_mb"]) /
                                               max(by["tandem plain w1"][k]["rank_peak_rss_mb"])),
            grad_bytes=by["tandem ddp w2"][repeats[0]]["grad_bytes"],
            buckets=by["tandem ddp w2"][repeats[0]]["buckets"],
            busbw_flat_gbps=ratio(lambda k: ar[k]["grad_bytes"] / ar[k]["flat_allreduce_p50_s"] * 2 * (n - 1) / n / 1e9),
            busbw_bucketed_gbps=ratio(lambda k: ar[k]["grad_bytes"] / ar[k]["bucketed_allreduce_p50_s"] * 2 * (n - 1) / n / 1e9),
        )
        out[model] = m
    return out


def markdown(summary, args):
    lines = [f"Medians over {args.repeats} repeats (min..max); batch {args.batch} per rank, {args.steps} timed steps, "
             "1 thread per rank, Gloo over loopback.\n",
             "| workload | Tandem DDP w2 samples/s/rank | PyTorch DDP w2 | ratio | scaling eff. Tandem | scaling eff. PyTorch "
             "| Tandem DDP w1 ÷ plain loop | exposed comm Tandem (ms) | exposed comm PyTorch (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model, m in summary.items():
        lines.append(f"| {model} | {fmt(m['throughput']['tandem ddp w2'], digits=0)} | "
                     f"{fmt(m['throughput']['pytorch ddp w2'], digits=0)} | {fmt(m['ratio_vs_pytorch_w2'])} | "
                     f"{fmt(m['scaling_efficiency_tandem'])} | {fmt(m['scaling_efficiency_pytorch'])} | "
                     f"{fmt(m['ddp_w1_vs_plain'])} | {fmt(m['exposed_comm_ms_tandem'])} | {fmt(m['exposed_comm_ms_pytorch'])} |")
    lines += ["", "| workload | gradient MB | buckets | plain loop Tandem ÷ PyTorch | DDP w1 Tandem ÷ PyTorch "
                  "| peak RSS DDP+views w2 (MB) | peak RSS plain w1 (MB) | ratio | busbw flat (GB/s) | busbw in DDP's buckets (GB/s) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for model, m in summary.items():
        lines.append(f"| {model} | {m['grad_bytes'] / 1e6:.2f} | {m['buckets']} | {fmt(m['plain_loop_ratio_vs_pytorch'])} | "
                     f"{fmt(m['ratio_vs_pytorch_w1'])} | {fmt(m['peak_rss_mb_ddp_view_w2'], digits=0)} | "
                     f"{fmt(m['peak_rss_mb_plain_w1'], digits=0)} | {fmt(m['peak_rss_ratio_view_vs_plain'])} | "
                     f"{fmt(m['busbw_flat_gbps'])} | {fmt(m['busbw_bucketed_gbps'])} |")
    return "\n".join(lines) + "\n"


def plot(summary, out_dir):
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("gnuplot not found: no plot")
        return
    data = os.path.join(out_dir, "throughput.dat")
    with open(data, "w") as f:
        for model, m in summary.items():
            t = m["throughput"]
            f.write(f"{model} {t['tandem ddp w2']['median']:.1f} {t['pytorch ddp w2']['median']:.1f} "
                    f"{t['tandem ddp w1']['median']:.1f} {t['pytorch ddp w1']['median']:.1f}\n")
    script = f"""
set terminal pngcairo size 900,500 noenhanced
set output '{os.path.join(out_dir, "throughput.png")}'
set title 'DDP throughput per rank (samples/s, median) - CPU, Gloo, 1 thread per rank'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set ylabel 'samples/s per rank (log)'
set key top right
plot '{data}' using 2:xtic(1) title 'Tandem DDP, 2 ranks', '' using 3 title 'PyTorch DDP, 2 ranks', \\
     '' using 4 title 'Tandem DDP, 1 rank', '' using 5 title 'PyTorch DDP, 1 rank'
"""
    subprocess.run([gnuplot], input=script, text=True, check=False)


if __name__ == "__main__":
    main()
