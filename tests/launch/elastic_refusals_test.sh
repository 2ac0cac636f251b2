#!/usr/bin/env bash
# elastic_refusals_test.sh TANDEM TRAINER: what an elastic node refuses, one line each, exit 1,
# while the job it knocked at goes on: a node of another run id, a node started with another
# --nnodes or --max-restarts, an endpoint that is no Tandem rendezvous, an endpoint nobody serves (join_timeout), and
# a job whose checkpoint is another model's (the worker's line, then the job fails after its
# restarts).
set -u
source "$(dirname "$0")/../faults/lib.sh"
tandem="$1"; trainer="$2"
scratch_dir work
port=$(free_port)
base=(run --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$port")
# expect NAME REGEX COMMAND...: COMMAND ends non-zero within 60 s and prints a line matching REGEX.
expect() {
  local name="$1" regex="$2"; shift 2
  timeout -s KILL 60 "$@" > "$work/$name.out" 2>&1; local rc=$?
  cat "$work/$name.out"
  [[ $rc -ne 0 && $rc -ne 137 ]] || fail "$name: exit $rc, expected a failure within 60 s"
  grep -Eq -- "$regex" "$work/$name.out" || fail "$name: no line matches $regex"
  echo "elastic refusals: $name: ok (exit $rc)"
}
start_job "$work/job.log" 120 "$tandem" "${base[@]}" --nnodes 1:2 --run-id job$$x --rdzv-conf last_call_timeout=1 -- sleep 60
job=$JOB
on_exit "pkill -TERM -f -- '--run-id job$$x --rdzv-conf' 2>/dev/null"  # the launcher; it stops its worker
for ((i = 0; i < 100; ++i)); do grep -qs "round 0:" "$work/job.log" && break; sleep 0.1; done
grep -q "round 0: node 0 of 1" "$work/job.log" || fail "the job did not start its round 0"

expect other_run "^tandem run: job failed: refusing to join: this node is for run 'job$$y' but the rendezvous serves run 'job$$x' \(give every node the same --run-id\)$" \
  "$tandem" "${base[@]}" --nnodes 1:2 --run-id job$$y -- true
expect other_nnodes "^tandem run: job failed: refusing to join: this node was started with --nnodes 1:3 but the run has --nnodes 1:2$" \
  "$tandem" "${base[@]}" --nnodes 1:3 --run-id job$$x -- true
expect other_restarts "^tandem run: job failed: refusing to join: this node was started with --max-restarts 2 but the run has --max-restarts 0$" \
  "$tandem" "${base[@]}" --nnodes 1:2 --run-id job$$x --max-restarts 2 -- true
kill -0 "$job" || fail "the job did not survive the refused nodes"
grep -q "round 1" "$work/job.log" && fail "a refused node restarted the job"

# A port where something else listens: it hangs up on the hello.
other=$(free_port)
python3 -c 'import socket,sys,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
end=time.time()+30
while time.time()<end:
    c,_=s.accept(); c.recv(100); c.close()' "$other" &
squatter=$!
on_exit "kill $squatter 2>/dev/null"
for ((i = 0; i < 100; ++i)); do ss -ltn "sport = :$other" | grep -q LISTEN && break; sleep 0.1; done
ss -ltn "sport = :$other" | grep -q LISTEN || fail "the stand-in listener did not start"
expect not_tandem "^tandem run: job failed: the elastic rendezvous at 127\.0\.0\.1:$other hung up on this node's hello \(is it a Tandem elastic rendezvous\?\)" \
  "$tandem" run --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$other" --nnodes 1:2 -- true
# An address of no machine here: nobody serves it.
expect unreachable "^tandem run: job failed: cannot reach the elastic rendezvous at 192\.0\.2\.1:$port within 2 s \(join_timeout\): " \
  "$tandem" run --nproc-per-node 1 --master-addr 192.0.2.1 --master-port "$port" --nnodes 1:2 --rdzv-conf join_timeout=2 -- true

# Another model's checkpoint: the worker's one line, then the job fails after its restart.
"$trainer" train --root "$work/other_model" --out "$work" --steps 2 --every 2 --hidden 16 > /dev/null 2>&1 || fail "could not write the other model's checkpoint"
expect other_model "load_state: model_0\.safetensors: 'fc1\.weight' is Float\[16, 8\] but the model's is Float\[32, 8\]$" \
  "$tandem" run --nproc-per-node 1 --nnodes 1:1 --max-restarts 1 -- "$trainer" train --root "$work/other_model" --out "$work" --steps 4 --every 2
grep -Eq "^tandem run: job failed: after 1 restart\(s\) \(--max-restarts\): rank 0 .* failed with exit code 2" "$work/other_model.out" \
  || fail "other_model: the launcher did not end the job after its one restart"
grep -q "^tandem run: restarting after: rank 0 " "$work/other_model.out" || fail "other_model: the restart did not happen"
echo "elastic refusals: ok"
