#!/usr/bin/env bash
# torchrun_elastic_test.sh TORCHRUN TRAINER: Tandem workers under PyTorch's own elastic launcher.
# Two torchrun agents on this host (`--nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d
# --max-restarts 2`) train fault_trainer at world 4; after step 5, the agent of ranks 2 and 3 is
# killed with its workers (SIGKILL). The other agent's workers fail in their collective, torchrun
# restarts them as a world of 2, and they resume from the newest checkpoint. Passes when every
# sample of every epoch was trained exactly once (check_samples.py); prints the time from the kill
# to training again. Exit 77 when the venv has no torchrun.
set -u
source "$(dirname "$0")/lib.sh"
torchrun="$1"; trainer="$2"; here="$(dirname "$0")"
[[ -x "$torchrun" ]] || { echo "SKIPPED: no torchrun at $torchrun (scripts/setup installs it in the venv)"; exit 77; }
scratch_dir work
port=$(free_port)
out="$work/out"; mkdir -p "$out"
agent=("$torchrun" --nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port"
       --rdzv-id "elastic$$" --rdzv-conf last_call_timeout=2 --max-restarts 2 --monitor-interval 0.2 --no-python)
train=(train --root "$work/checkpoints" --out "$out" --epochs 6 --every 2 --sample-log --step-delay-ms 250)
descendants() { local c; for c in $(pgrep -P "$1"); do descendants "$c"; echo "$c"; done; }

start_job "$work/agent1.log" 300 "${agent[@]}" "$trainer" "${train[@]}"
job1=$JOB
sleep 1
start_job "$work/agent2.log" 300 "${agent[@]}" "$trainer" "${train[@]}"
job2=$JOB
wait_trace_step "$out/trace.a0.r0" 5 120 "$job1"
# The agent of ranks 2 and 3 (the workers' parent), with everything below it.
victim=$(parent_of "$(cat "$out/pid.a0.r2")")
[[ "$victim" == "$(parent_of "$(cat "$out/pid.a0.r3")")" ]] || fail "ranks 2 and 3 have different parents"
kill -9 $(descendants "$victim") "$victim"
killed=$(now_ns)
echo "torchrun elastic: killed the agent of ranks 2 and 3 (pid $victim) and its workers"
JOB=$job1; finish_job
[[ $RC -eq 0 ]] || fail "the surviving agent's job failed (exit $RC)"
wait "$job2" 2>/dev/null
grep -h -E "restart|rendezvous|WorkerGroup|world_size" "$work/agent1.log" | cut -d' ' -f2- | head -20
back=$(sort -n "$out"/resumed.a1.r* | tail -1)
echo "torchrun elastic: kill -> training again at world 2 ($(head -1 "$out/trace.a1.r0")): $(ms_between "$killed" "$back") ms"
[[ ! -e "$out/trace.a1.r2" ]] || fail "the restarted world has a rank 2: not a world of 2"
python3 "$here/check_samples.py" "$out" 96 6 4,2 || fail "the sample log breaks every-sample-once"
echo "torchrun elastic: ok"
