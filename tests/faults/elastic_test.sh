#!/usr/bin/env bash
# elastic_test.sh TANDEM TRAINER: `tandem run --nnodes 1:2 --nproc-per-node 2 --max-restarts 2` on
# two "hosts" (network namespaces A and B; A serves the rendezvous). After step 5 of 24, in the
# second epoch, host B is killed (SIGKILL of its launcher and workers): A goes on alone, at world 2,
# from the newest checkpoint. Two steps later, mid-epoch again, B starts again and joins at the
# next round, which A begins at once (its workers save on SIGTERM): world 4 again, to the end. Passes when the
# rounds are 4, 2 and 4 ranks, every sample of every epoch was trained exactly once (the
# sample-id log, check_samples.py), the epochs round 2 trained whole are those of the
# uninterrupted run at world 4 rank by rank, and the final loss is within the spread of
# uninterrupted runs (printed). The time from the kill to training again is printed.
set -u
source "$(dirname "$0")/lib.sh"
tandem="$1"; trainer="$2"; here="$(dirname "$0")"
source "$here/../support/two_hosts.sh"
two_hosts elastic 234
port=$(free_port)
out="$work/out"; mkdir -p "$out"
launch=(run --nnodes 1:2 --nproc-per-node 2 --max-restarts 2 --master-addr "$ADDR_A" --master-port "$port"
        --rdzv-conf last_call_timeout=2 --grace-period 20)
train=(train --root "$work/checkpoints" --out "$out" --epochs 8 --every 2 --sample-log --save-on-sigterm --step-delay-ms 250)
wait_step() { wait_trace_step "$out/trace.a$1.r0" "$2" "$3" "$job_a"; }  # wait_step ROUND STEP SECONDS

# B first: it retries its connection until A serves, so that round 0 has both whatever A's start
# costs (A's last call, 2 s, starts when A joins).
start_job "$work/b.log" 300 ip netns exec "$B" "$tandem" "${launch[@]}" --log-dir "$work/logs_b" -- "$trainer" "${train[@]}"
job_b=$JOB
start_job "$work/a.log" 300 ip netns exec "$A" "$tandem" "${launch[@]}" --log-dir "$work/logs_a" -- "$trainer" "${train[@]}"
job_a=$JOB
wait_step 0 5 120
ip netns pids "$B" | xargs -r kill -9
killed=$(now_ns)
wait "$job_b" 2>/dev/null
echo "elastic: killed host B (launcher and workers) after step $(last_trace_step "$out/trace.a0.r0") of round 0"
wait_step 1 1 120
back=$(sort -n "$out"/resumed.a1.r* | tail -1)
resumed_at=$(head -1 "$out/trace.a1.r0")
echo "elastic: kill -> host A training again at world 2 ($resumed_at): $(ms_between "$killed" "$back") ms"
wait_step 1 "$(( $(cut -d' ' -f2 <<<"$resumed_at") + 2 ))" 60
joined=$(now_ns)
start_job "$work/b2.log" 300 ip netns exec "$B" "$tandem" "${launch[@]}" --log-dir "$work/logs_b2" -- "$trainer" "${train[@]}"
job_b2=$JOB
JOB=$job_a; finish_job; rc_a=$RC
JOB=$job_b2; finish_job; rc_b2=$RC
cut -d' ' -f2- "$work/a.log"
[[ $rc_a -eq 0 && $rc_b2 -eq 0 ]] || fail "host A exited $rc_a, host B's second launcher $rc_b2"
noticed=$(time_of "$work/a.log" "next round: a node of round 0 was lost")
formed=$(time_of "$work/a.log" "round 1: node 0 of 1")
[[ -n "$noticed" && -n "$formed" ]] || fail "host A's launcher did not note the lost node and round 1"
echo "elastic: kill -> A's launcher told of the lost node $(ms_between "$killed" "$noticed") ms -> round 1 formed" \
     "$(ms_between "$killed" "$formed") ms (last_call_timeout 2 s) -> workers resumed $(ms_between "$killed" "$back") ms"
back2=$(sort -n "$out"/resumed.a2.r* | tail -1)
echo "elastic: host B started again -> training at world 4: $(ms_between "$joined" "$back2") ms"
grep -q "round 0: node 0 of 2, ranks 0..1 of a world of 4" "$work/a.log" || fail "round 0 was not A and B at world 4"
grep -q "round 1: node 0 of 1, ranks 0..1 of a world of 2" "$work/a.log" || fail "A did not go on alone at world 2"
grep -q "round 2: node 0 of 2, ranks 0..1 of a world of 4" "$work/a.log" || fail "B did not join round 2"
grep -q "round 2: node 1 of 2, ranks 2..3 of a world of 4" "$work/b2.log" || fail "B's second launcher was not node 1 of round 2"
elastic_loss=$(grep -h '^loss ' "$out"/trace.a2.r0 | cut -d' ' -f2)
[[ -n "$elastic_loss" ]] || fail "round 2 printed no final loss"
# Uninterrupted runs (one host, 4 processes), three seeds: the run-to-run spread.
losses=()
for seed in 7 8 9; do
  ref="$work/ref$seed"; mkdir -p "$ref"
  run_job "$ref/launcher.log" 300 "$tandem" run --nproc-per-node 4 -- \
    "$trainer" train --root "$ref/checkpoints" --out "$ref" --epochs 8 --every 1000 --seed "$seed" --sample-log
  [[ $RC -eq 0 ]] || fail "the uninterrupted run of seed $seed failed"
  losses+=("$(grep -h '^loss ' "$ref/trace.a0.r0" | cut -d' ' -f2)")
done
# Every sample once; and the epochs round 2 trained whole are seed 7's uninterrupted epochs at world 4.
python3 "$here/check_samples.py" "$out" 96 8 4,2,4 "$work/ref7" || fail "the sample log breaks every-sample-once"
echo "elastic: final loss $elastic_loss (seed 7, world 4 -> 2 -> 4); uninterrupted at world 4, seeds 7 8 9: ${losses[*]}"
python3 - "$elastic_loss" "${losses[@]}" <<'PY' || fail "the elastic run's loss is outside the uninterrupted runs' spread"
import sys
x, runs = float(sys.argv[1]), [float(v) for v in sys.argv[2:]]
spread = max(runs) - min(runs)
lo, hi = min(runs) - spread, max(runs) + spread
print(f"elastic: spread of the uninterrupted runs {spread:.4f}; allowed {lo:.4f}..{hi:.4f}")
sys.exit(0 if lo <= x <= hi else 1)
PY
echo "elastic: ok"
