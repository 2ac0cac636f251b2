#!/usr/bin/env bash
# slurm_requeue_test.sh TANDEM TRAINER REFERENCE: preemption under a real (private) Slurm, with
# the recipe of examples/slurm/requeue.sbatch as users run it. The job (2 processes of
# tests/faults/fault_trainer, 20 steps, a checkpoint every 4) waits after step 6; the test then
# sends what Slurm sends before a time limit or a preemption, `scancel --signal=TERM --batch`.
# The script forwards it through `tandem run` to the workers, which save checkpoint_000006 in the
# grace period; the script requeues the job; Slurm starts it again and the trainer resumes from
# step 6 by itself (load_state_if_any). Its final weights must equal the uninterrupted run's
# (REFERENCE, the faults.reference fixture) bit for bit, on both ranks.
set -eu
tandem="$1"; trainer="$2"; ref="$3"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../support/slurm.sh"
source "$here/../faults/lib.sh"
scratch_dir work
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TANDEM_CPU_BACKEND OMP_NUM_THREADS
slurm_start 4
# One folder of traces per start of the job (SLURM_RESTART_COUNT counts the requeues).
cat >"$work/train.sh" <<SH
#!/bin/bash
out="$work/start-\${SLURM_RESTART_COUNT:-0}"; mkdir -p "\$out"
exec "$trainer" train --root "$work/checkpoints" --out "\$out" --steps 20 --every 4 --save-on-sigterm --wait-for-sigterm-at 6
SH
chmod +x "$work/train.sh"
job=$(TANDEM="$tandem" NPROC=2 sbatch --parsable -N1 -n2 -o "$work/job.out" "$here/../../examples/slurm/requeue.sbatch" "$work/train.sh")
wait_for "$work/start-0/waiting.r0" 90
wait_for "$work/start-0/waiting.r1" 90
signalled=$(now_ns)
scancel --signal=TERM --batch "$job"
# Slurm holds a requeued batch job for a while before it may start again (reason BeginTime; about
# 3 minutes here): that is the site's scheduling, not the recipe. The test lets it start now.
for _ in $(seq 300); do
  held="$(squeue -h -j "$job" -o '%T %r' 2>/dev/null || true)"
  [[ $held == PENDING* ]] && break
  sleep 0.2
done
echo "slurm requeue: the requeued job is ${held:-gone}; starting it now (scontrol update StartTime=now)"
scontrol update JobId="$job" StartTime=now || fail "scontrol update JobId=$job StartTime=now: the job is ${held:-gone}"
for _ in $(seq 900); do  # until the job's second start has ended (3 min)
  [[ -z "$(squeue -h -j "$job" 2>/dev/null || true)" && -e "$work/start-1/trace.a0.r1" ]] && break
  sleep 0.2
done
cat "$work/job.out"
[[ -z "$(squeue -h -j "$job" 2>/dev/null)" ]] || { scancel "$job"; fail "job $job still in the queue after 3 minutes: $(squeue -j "$job")"; }
grep -q "requeue.sbatch: stopped by SIGTERM (launcher exit 143): requeueing job $job" "$work/job.out" ||
  fail "the script did not requeue the job after SIGTERM"
grep -q "requeue.sbatch: job $job, start 2, 2 process(es)" "$work/job.out" || fail "Slurm did not start the job a second time"
for r in 0 1; do
  grep -qx "saved-on-sigterm 6 $work/checkpoints/checkpoint_000006" "$work/start-0/trace.a0.r$r" ||
    fail "rank $r of the first start did not save step 6 on SIGTERM"
  [[ "$(head -1 "$work/start-1/trace.a0.r$r")" == "resumed 6 $work/checkpoints/checkpoint_000006" ]] ||
    fail "rank $r of the second start did not resume from step 6: $(head -1 "$work/start-1/trace.a0.r$r")"
  compare_step "$work/start-1/trace.a0.r$r" "$ref/trace.a0.r$r" final
done
resumed=$(cat "$work/start-1/resumed.a0.r0")
echo "slurm requeue: scancel --signal=TERM -> checkpoint_000006 -> requeued -> resumed at step 6 $(ms_between "$signalled" "$resumed") ms after the signal"
echo "slurm requeue: ok: the final weights equal the uninterrupted run's on both ranks, bit for bit"
