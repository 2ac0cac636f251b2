#!/usr/bin/env bash
# worker_records.sh TANDEM_CLI WORKER PEER PYTHON
# The two benchmark workers `tandem bench` starts (tandem-bench-worker and peer.py), at --scale
# tiny, 2 timed steps after 1 warmup: every strategy of the strategy table (`WORKER
# --list-strategies`, src/bench/strategies.h) with each at world 1 and 2 (ranks through
# `TANDEM_CLI run --nproc-per-node N`; replicas where the table says so), the three models in
# turn, plus a few precisions. Then PYTHON judges the records against the table: each parses and
# has the fields of "tandem-bench-run/1"; every run exits 0, the unsupported ones (a worker the
# table says does not measure it) with exactly the unsupported record; Tandem's and PyTorch's
# "params" and "grad_bytes" are equal for each model (the two definitions of a model match); bad
# flags exit 2 with one line on stderr; no peer ends with Gloo threads alive (they can abort it at
# exit: bench/peer.py, Note [Gloo threads at exit]).
# Exit 77 (ctest: skipped) only when PYTHON cannot import torch.
set -u
cli="$1"; worker="$2"; peer="$3"; python="$4"
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "SKIPPED: $python cannot import torch (scripts/setup installs the torch wheel into .venv)"
  exit 77
fi
source "$(dirname "$0")/../support/logs.sh"
scratch_dir dir  # on failure every measurement's log is printed (a rejected record's included)
export OMP_NUM_THREADS=1
"$worker" --list-strategies > "$dir/strategies.jsonl" || { echo "FAILED: $worker --list-strategies"; exit 1; }
# name<TAB>launch, in the table's order
table=$("$python" -c 'import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    print(e["name"] + "\t" + e["launch"])' "$dir/strategies.jsonl")
common=(--scale tiny --steps 2 --batch-size 2 --threads 1 --sweep-max-bytes 16384)
n=0
failed=0
# run IMPL NPROC MODEL STRATEGY [FLAGS...]: one measurement; its record goes to $dir/$n.jsonl and
# what was asked to $dir/plan.tsv.
# Under a sanitizer (scripts/sanitize sets TANDEM_TEST_INSTRUMENTED) only Tandem's worker runs: the
# peer is uninstrumented Python, measured by the main suite's run of this test.
impls="tandem pytorch"
[[ -n "${TANDEM_TEST_INSTRUMENTED:-}" ]] && impls="tandem"
run() {
  local impl="$1" nproc="$2" model="$3" strategy="$4"; shift 4
  [[ " $impls " == *" $impl "* ]] || return 0
  n=$((n + 1))
  local cmd=("$worker")
  [[ "$impl" == pytorch ]] && cmd=("$python" "$peer")
  # Bounded (a few seconds each here): a hang fails this measurement with its log, not the test.
  if ! timeout -k 5 120 "$cli" run --nproc-per-node "$nproc" -- "${cmd[@]}" --model "$model" --strategy "$strategy" \
      "${common[@]}" --warmup "${WARMUP:-1}" "$@" --out "$dir/$n.jsonl" >"$dir/$n.log" 2>&1; then
    echo "FAILED (exit $?): #$n $impl nproc $nproc $model $strategy $*; its log, $n.log, is printed at exit"
    failed=1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$impl" "$nproc" "$model" "$strategy" "$*" >>"$dir/plan.tsv"
}

start=$SECONDS
# Every strategy of each impl at world 1 and 2; the model rotates with the strategy and the world
# (the same model for both impls, so each model meets both impls in several strategies): the whole
# product of 3 models took 190 s on 2 cores. TANDEM_BENCH_TEST_ALL_MODELS=1 runs the product.
models=(small medium large)
i=0
while IFS=$'\t' read -r strategy launch; do
  for world in 1 2; do
    [[ "$launch" == alone && $world -eq 2 ]] && continue
    chosen=("${models[$(((i + world) % 3))]}")
    [[ "${TANDEM_BENCH_TEST_ALL_MODELS:-0}" == 1 ]] && chosen=("${models[@]}")
    for model in "${chosen[@]}"; do
      for impl in tandem pytorch; do
        case "$launch" in
          replicas) run "$impl" 1 "$model" "$strategy" --replicas "$world" ;;
          *) run "$impl" "$world" "$model" "$strategy" ;;
        esac
      done
    done
  done
  i=$((i + 1))
done <<< "$table"
# A plain loop launched twice over (unsupported), and the precisions: fp16 (autocast and a
# GradScaler) under DDP, bf16 through the Accelerator and across DataParallel's replica threads;
# accelerate on CPU ignores fp16, so the peer calls it unsupported.
for impl in tandem pytorch; do
  run "$impl" 2 small single
  run "$impl" 2 medium ddp --precision fp16
done
run tandem 1 large accelerate --precision bf16
run pytorch 1 large accelerate --precision fp16
run tandem 1 medium dp-persistent --precision bf16 --replicas 2
# Tensor parallelism has a plan for the GPT alone (the rotation above gives it the others, which it
# refuses): one TP group of 2 ranks, bf16 through the cut layers, and FSDP across TP pairs on a
# 2 x 2 mesh.
for impl in tandem pytorch; do
  run "$impl" 2 large tp
  run "$impl" 4 large fsdp+tp
done
run tandem 2 large tp --precision bf16
# Pipelines cut the GPT alone: each schedule at 2 ranks (interleaved: 4 stages of the tiny GPT's 3
# blocks and its head), 1F1B under bf16, GPipe with 3 (uneven) microbatches; 3 cannot
# interleave over 2 ranks (unsupported).
for impl in tandem pytorch; do
  for schedule in gpipe 1f1b interleaved; do run "$impl" 2 large "pp-$schedule"; done
  run "$impl" 2 large pp-interleaved --microbatches 3
done
run tandem 2 large pp-1f1b --precision bf16
run tandem 2 large pp-gpipe --microbatches 3
# --min-seconds: the ranks agree on more steps than --steps when those would take less time. Three
# warm-up steps: the count comes from the last one, past DDP's first-iteration work.
for impl in tandem pytorch; do
  WARMUP=3 run "$impl" 2 small ddp --min-seconds 0.5
done
echo "$n measurements in $((SECONDS - start)) s"

# No peer process ends with Gloo threads running: they can abort it in the interpreter's
# finalization, at random, under load (bench/peer.py, Note [Gloo threads at exit]).
if grep -l "outlived destroy_process_group" "$dir"/*.log; then
  echo "FAILED: a peer ended with Gloo worker threads alive (the logs above)"; failed=1
fi

# Bad flags: one line on stderr, exit 2.
for cmd in "$worker" "$python $peer"; do
  $cmd --model huge >"$dir/bad.out" 2>"$dir/bad.err"
  rc=$?
  if [[ $rc -ne 2 || $(wc -l <"$dir/bad.err") -ne 1 ]]; then
    echo "FAILED: '$cmd --model huge' exited $rc with stderr:"; cat "$dir/bad.err"; failed=1
  fi
done

"$python" - "$dir" "$impls" <<'EOF' || failed=1
import json, os, sys

d = sys.argv[1]
RECORD = "tandem-bench-run/1"
HEAD = ["record", "impl", "model", "scale", "strategy", "device", "precision", "world", "nodes"]
FIELDS = HEAD + ["batch_per_device", "steps", "warmup", "threads", "params", "grad_bytes", "buckets", "p50_s",
                 "p95_s", "rank_p50_s", "forward_p50_s", "backward_p50_s", "optimizer_p50_s", "peak_mem_bytes",
                 "mem_kind", "rank_faults_per_step", "host_allocator", "versions"]
errors, counts, held = [], {}, {}
table = {e["name"]: e for e in map(json.loads, open(os.path.join(d, "strategies.jsonl")))}


def model_state_ok(r, strategy, precision, ranks, impl):
    """Accounted model state, one entry per rank. DDP and ZeRO-1: the whole parameters and gradients
    on each, optimizer state (SGD momentum) of every parameter, or under ZeRO-1 of the rank's share:
    the shares add up to the whole (fp16 may skip every step of so short a run while the scale finds
    its level: no momentum yet). ZeRO-2 keeps gradient and state slices of its buckets padded to the
    world size: they add up to the whole plus less than one element per rank per bucket. FSDP: each
    rank its rows; gradients and optimizer state add up to the whole, the parameters too (Tandem
    counts its padding, under one row per parameter and rank)."""
    states = r["model_state_bytes"]
    if len(states) != ranks:
        return False
    grads = sum(m["grads"] for m in states)
    optimizer = sum(m["optimizer"] for m in states)
    tp = tp_group(table[strategy], ranks)
    if tp > 1:
        # The ranks' gradients add up to one TP group's: the cut layers once, the whole ones (norms,
        # position embedding) on each of its ranks; FSDP's shards of them add up the same. Under tp
        # alone Tandem's gradients are its parameters' size; PyTorch's of the row-cut embedding is
        # whole on each rank (Replicate), larger.
        same = (lambda m: m["params"] == m["grads"]) if impl == "tandem" else (lambda m: m["params"] <= m["grads"])
        return (r["grad_bytes"] < grads < tp * r["grad_bytes"] and optimizer == grads and
                (strategy != "tp" or all(same(m) for m in states)))
    if strategy == "fsdp":
        return (grads == r["grad_bytes"] and r["grad_bytes"] <= sum(m["params"] for m in states) < 2 * r["grad_bytes"]
                and (precision == "fp16" or optimizer == r["grad_bytes"]))
    if not all(m["params"] == r["grad_bytes"] for m in states):
        return False
    if strategy == "zero2":
        if not (r["grad_bytes"] <= grads < r["grad_bytes"] + 4 * ranks * r["buckets"] and len({m["grads"] for m in states}) == 1):
            return False
    elif not all(m["grads"] == r["grad_bytes"] for m in states):
        return False
    expected = grads if strategy == "zero2" else r["grad_bytes"] if strategy == "zero1" else ranks * r["grad_bytes"]
    return precision == "fp16" or optimizer == expected



PP_FIELDS = ("pp_schedule", "pp_microbatches", "pp_stages_per_rank", "rank_pp_bubble", "pp_bubble_theory",
             "rank_pp_activation_bytes")


def pipeline_ok(r, entry, nproc, m, impl):
    v = 2 if entry["pp_schedule"] == "interleaved" else 1
    return (r["pp_schedule"] == entry["pp_schedule"] and r["pp_microbatches"] == m and r["pp_stages_per_rank"] == v
            and abs(r["pp_bubble_theory"] - (nproc - 1) / (v * m + nproc - 1)) < 1e-12
            and len(r["rank_pp_bubble"]) == nproc and all(0 <= b < 1 for b in r["rank_pp_bubble"])
            and len(r["rank_pp_activation_bytes"]) == nproc
            and all((b > 0) if impl == "tandem" else (b == -1) for b in r["rank_pp_activation_bytes"]))


def tp_group(entry, nproc):
    return nproc if entry["tp_size"] == -1 else max(entry["tp_size"], 1)


def expect_unsupported(impl, nproc, strategy, flags, model):
    entry = table[strategy]
    if entry["launch"] != "ranks" and nproc > 1:
        return True
    # The table's own refusals: a model without a plan, a 2-D mesh the world does not make.
    if entry["models"] and model not in entry["models"]:
        return True
    if entry["tp_size"] > 0 and (nproc % entry["tp_size"] or nproc // entry["tp_size"] < 2):
        return True
    if entry["pp_schedule"] and (nproc < 2 or (entry["pp_schedule"] == "interleaved" and "--microbatches 3" in flags)):
        return True
    if not entry[impl]:  # the table's "tandem" / "pytorch": which worker measures it
        return True
    if impl == "pytorch" and strategy == "dp":  # torch.nn.DataParallel replicates across CUDA devices only
        return True
    return impl == "pytorch" and strategy == "accelerate" and "fp16" in flags  # accelerate on CPU ignores fp16


for line in open(os.path.join(d, "plan.tsv")):
    n, impl, nproc, model, strategy, flags = line.rstrip("\n").split("\t")
    nproc, what = int(nproc), f"#{n} {impl} nproc {nproc} {model} {strategy} {flags}".strip()
    path = os.path.join(d, f"{n}.jsonl")
    lines = open(path).read().splitlines() if os.path.exists(path) else []
    if len(lines) != 1:
        errors.append(f"{what}: {len(lines)} record lines, expected 1")
        continue
    try:
        r = json.loads(lines[0])
    except ValueError as e:
        errors.append(f"{what}: not JSON ({e}): {lines[0][:200]}")
        continue
    replicas = int(flags.split("--replicas ")[1].split()[0]) if "--replicas" in flags else 2
    precision = flags.split("--precision ")[1].split()[0] if "--precision" in flags else "fp32"
    entry = table[strategy]
    dp = entry["launch"] == "replicas"
    world = replicas if dp else nproc
    head = dict(record=RECORD, impl=impl, model=model, scale="tiny", strategy=strategy, device="cpu",
                precision=precision, world=world, nodes=1)
    for k, v in head.items():
        if r.get(k) != v:
            errors.append(f"{what}: {k} is {r.get(k)!r}, expected {v!r}")
    if expect_unsupported(impl, nproc, strategy, flags, model):
        if set(r) != set(HEAD) | {"unsupported"}:
            errors.append(f"{what}: expected exactly the unsupported record, got keys {sorted(r)}")
        elif not isinstance(r["unsupported"], str) or not r["unsupported"] or "\n" in r["unsupported"]:
            errors.append(f"{what}: 'unsupported' is not a one-line reason: {r['unsupported']!r}")
        continue
    if "unsupported" in r:
        errors.append(f"{what}: unexpectedly unsupported: {r['unsupported']}")
        continue
    missing = [k for k in FIELDS if k not in r]
    if missing:
        errors.append(f"{what}: missing {missing}")
        continue
    ranks = 1 if dp else nproc
    raw = entry["timing"] != "step"
    sweep = entry["timing"] == "sweep"
    checks = {
        "batch_per_device == 2": r["batch_per_device"] == 2,
        # --min-seconds 0.5 (after 3 warm-up steps): tiny steps take well under 0.25 s, so more than 2.
        "steps == 2 and warmup == 1 (more steps and 3 with --min-seconds), threads == 1":
            (r["steps"] > 2 and r["warmup"] == 3 if "--min-seconds" in flags else (r["steps"], r["warmup"]) == (2, 1))
            and r["threads"] == 1,
        "params a positive int (0 for sweep)": isinstance(r["params"], int) and
            (r["params"] == 0 if sweep else r["params"] > 0),
        "grad_bytes == 4 * params": r["grad_bytes"] == 4 * r["params"],
        # Both Accelerators wrap DDP even at world 1 under a launcher (accelerate: MASTER_ADDR set).
        "buckets > 0 exactly under DDP (the table's buckets)": isinstance(r["buckets"], int) and
            (r["buckets"] > 0) == entry["buckets"],
        # Tandem's DDP records its bucket layout (the projection's input): it adds up to the gradient.
        "bucket_bytes: one per bucket, summing to grad_bytes": impl != "tandem" or not entry["buckets"] or
            (len(r.get("bucket_bytes", [])) == r["buckets"] and sum(r["bucket_bytes"]) == r["grad_bytes"]),
        "0 < p50_s <= p95_s": 0 < r["p50_s"] <= r["p95_s"],
        "rank_p50_s: one positive per rank, rank 0's first": len(r["rank_p50_s"]) == ranks and
            all(t > 0 for t in r["rank_p50_s"]) and r["rank_p50_s"][0] == r["p50_s"],
        # A pipeline's forwards and backwards interleave in its schedule: no phase of their own.
        "phases positive (0 for allreduce/sweep, forward and backward 0 for pipelines)": all(
            (r[k] == 0) if raw or (entry["pp_schedule"] and k != "optimizer_p50_s") else (r[k] > 0)
            for k in ("forward_p50_s", "backward_p50_s", "optimizer_p50_s")),
        "peak_mem_bytes: one positive int per device": len(r["peak_mem_bytes"]) == world and
            all(isinstance(b, int) and b > 0 for b in r["peak_mem_bytes"]),
        "mem_kind (the table's memory)": r["mem_kind"] == entry["memory"],
        # Accounted model state where the table says (model_state_ok).
        "model_state_bytes exactly where the table's model_state": ("model_state_bytes" in r) == entry["model_state"]
            and (not entry["model_state"] or model_state_ok(r, strategy, precision, ranks, impl)),
        # FSDP's host time blocked on its collectives, per step (a step's waits fit in it).
        "exposed_gather_p50_s and exposed_reduce_scatter_p50_s exactly for Tandem's fsdp and fsdp+tp, within the step":
            all((k in r) == (impl == "tandem" and strategy in ("fsdp", "fsdp+tp")) and 0 <= r.get(k, 0) <= r["p50_s"]
                for k in ("exposed_gather_p50_s", "exposed_reduce_scatter_p50_s")),
        # Tensor parallelism's TP group per step: its size, time within the step, and at more than one
        # rank some collectives and bytes.
        "tp_size, tp_comm_p50_s, tp_comm_bytes, tp_collectives exactly for Tandem's TP entries":
            all((k in r) == (impl == "tandem" and entry["tp_size"] != 0)
                for k in ("tp_size", "tp_comm_p50_s", "tp_comm_bytes", "tp_collectives")) and
            ("tp_size" not in r or (r["tp_size"] == tp_group(entry, nproc) and 0 <= r["tp_comm_p50_s"] <= r["p50_s"]
                                    and (r["tp_size"] == 1 or (r["tp_collectives"] > 0 and r["tp_comm_bytes"] > 0)))),
        # Pipelines: the schedule, m (--microbatches or twice the ranks), the theory's bubble, each
        # rank's share of a step blocked in [0, 1), and the activations it held: Tandem's counted,
        # PyTorch's not on CPU (-1).
        "pp_* fields exactly for the pipeline entries, consistent": all(
            (k in r) == bool(entry["pp_schedule"]) for k in PP_FIELDS) and (not entry["pp_schedule"] or pipeline_ok(
                r, entry, nproc, int(flags.split("--microbatches ")[1].split()[0]) if "--microbatches" in flags else 2 * nproc,
                impl)),
        "versions.torch": isinstance(r["versions"], dict) and r["versions"].get("torch"),
        "versions.accelerate on the peer's accelerate": (impl != "pytorch" or strategy != "accelerate") or
            bool(r["versions"].get("accelerate")),
        "allreduce_p50_s and flat_allreduce_p50_s exactly for the gradient all-reduce":
            all(((k in r) and r[k] > 0) == (entry["timing"] == "gradient-allreduce")
                for k in ("allreduce_p50_s", "flat_allreduce_p50_s")),
        # Under `tandem run` (no MPI launcher) the CPU collectives run on Gloo; one process has none.
        "backend: gloo exactly for the multi-process strategies": r.get("backend") ==
            ("gloo" if entry["launch"] == "ranks" else None),
        "sweep: 4096 and 16384 bytes exactly for sweep": ("sweep" in r) == sweep and
            (not sweep or ([s["bytes"] for s in r["sweep"]] == [4096, 16384] and
                                     all(s["p50_s"] > 0 for s in r["sweep"]))),
    }
    for name, ok in checks.items():
        if not ok:
            errors.append(f"{what}: {name}: {lines[0][:400]}")
    if not sweep:
        counts.setdefault(model, {}).setdefault((r["params"], r["grad_bytes"]), set()).add(impl)
    if impl == "tandem" and entry["pp_schedule"] and precision == "fp32":
        held[(entry["pp_schedule"], r["pp_microbatches"])] = r["rank_pp_activation_bytes"]

# GPipe holds every microbatch's activations on stage 0 until its backwards begin, 1F1B at most P
# of them: at 2 ranks and 4 microbatches, fewer bytes (counted by the allocator, not timed).
gpipe, one_f_one_b = held.get(("gpipe", 4)), held.get(("1f1b", 4))
if not gpipe or not one_f_one_b or not one_f_one_b[0] < gpipe[0]:
    errors.append(f"stage 0's activations: 1F1B {one_f_one_b} not below GPipe's {gpipe} at 4 microbatches")

# The oracle: both definitions of each model have the same parameters (one definition alone under a
# sanitizer: its runs agree with each other).
for model in ("small", "medium", "large"):
    seen = counts.get(model, {})
    impls = set().union(*seen.values()) if seen else set()
    if len(seen) != 1 or impls != set(sys.argv[2].split()):
        errors.append(f"{model}: (params, grad_bytes) differ or lack an impl: "
                      f"{ {k: sorted(v) for k, v in seen.items()} }")
    else:
        print(f"{model}: params {next(iter(seen))[0]}, grad_bytes {next(iter(seen))[1]} ({' = '.join(sorted(impls))})")
for e in errors:
    print("FAILED:", e)
sys.exit(1 if errors else 0)
EOF
if [[ $failed -ne 0 ]]; then
  exit 1
fi
echo "PASSED: every record of $n measurements"
