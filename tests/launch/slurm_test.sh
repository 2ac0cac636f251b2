#!/usr/bin/env bash
# slurm_test.sh TANDEM TRAIN_DDP FASHION_MNIST: Tandem programs started by a real Slurm (a private
# one, tests/support/slurm.sh: munged, slurmctld and slurmd started here and stopped at exit).
#   - `srun -N1 -n2 train_ddp`: the world from Slurm's variables, rank 0's host and port derived
#     from them (Note [Slurm's rank 0]; no MASTER_ADDR by hand), the same weights as `tandem run`;
#   - `srun --mpi=pmix`: the MPI backend chosen by itself (PMIx's variables), the same weights;
#   - the Fashion-MNIST example under srun: the accuracy `tandem run` gets;
#   - `sbatch --wait` of a script that runs `tandem run` inside the allocation;
#   - no daemon of ours left afterwards.
set -eu
tandem="$1"; train_ddp="$2"; fashion_mnist="$3"
source "$(dirname "$0")/../support/slurm.sh"
scratch_dir work
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TANDEM_CPU_BACKEND OMP_NUM_THREADS
slurm_start 4
status=0
fail() { echo "FAIL: $*"; status=1; }
checksum() { grep -o 'identical weights (checksum [-0-9.]*)' "$1" | head -1; }

# The reference: the same program under our own launcher.
timeout -k 5 120 "$tandem" run --nproc-per-node 2 -- "$train_ddp" --epochs 1 >"$work/tandem-run.log" 2>&1 ||
  { fail "tandem run train_ddp exited $?"; show_log "$work/tandem-run.log"; exit 1; }
reference=$(checksum "$work/tandem-run.log")
[[ -n $reference ]] || { fail "no checksum from tandem run"; show_log "$work/tandem-run.log"; exit 1; }

timeout -k 5 120 srun -N1 -n2 "$train_ddp" --epochs 1 >"$work/srun.log" 2>&1 || { fail "srun -n2 train_ddp exited $?"; show_log "$work/srun.log"; }
[[ "$(checksum "$work/srun.log")" == "$reference" ]] || fail "srun -n2 train_ddp: '$(checksum "$work/srun.log")', tandem run: '$reference'"
grep -q "train_ddp: 2 ranks, CPU collectives on gloo" "$work/srun.log" || fail "srun -n2 did not make a world of 2 on Gloo"
echo "srun -N1 -n2 train_ddp:            $(checksum "$work/srun.log")  (tandem run: $reference)"

timeout -k 5 120 srun --mpi=pmix -N1 -n2 "$train_ddp" --epochs 1 >"$work/pmix.log" 2>&1 || { fail "srun --mpi=pmix exited $?"; show_log "$work/pmix.log"; }
grep -q "train_ddp: 2 ranks, CPU collectives on mpi" "$work/pmix.log" ||
  fail "srun --mpi=pmix did not choose the MPI backend by itself: $(grep 'CPU collectives' "$work/pmix.log")"
[[ "$(checksum "$work/pmix.log")" == "$reference" ]] || fail "srun --mpi=pmix: '$(checksum "$work/pmix.log")', tandem run: '$reference'"
echo "srun --mpi=pmix -N1 -n2 train_ddp: $(checksum "$work/pmix.log")  (MPI backend, chosen by itself)"

# The main job: Fashion-MNIST, one epoch on 2 tasks, as under tandem run.
accuracy() { grep -Eo 'test accuracy [0-9.]+% \([0-9]+/10000 images\)' "$1" | tail -1; }
timeout -k 5 300 "$tandem" run --nproc-per-node 2 -- "$fashion_mnist" --epochs 1 --checkpoints "$work/fm-tandem.ckpt" \
  >"$work/fm-tandem.log" 2>&1 || { fail "tandem run fashion_mnist exited $?"; show_log "$work/fm-tandem.log"; }
timeout -k 5 300 srun -N1 -n2 "$fashion_mnist" --epochs 1 --checkpoints "$work/fm-srun.ckpt" >"$work/fm-srun.log" 2>&1 ||
  { fail "srun fashion_mnist exited $?"; show_log "$work/fm-srun.log"; }
[[ -n "$(accuracy "$work/fm-srun.log")" && "$(accuracy "$work/fm-srun.log")" == "$(accuracy "$work/fm-tandem.log")" ]] ||
  fail "fashion_mnist under srun: '$(accuracy "$work/fm-srun.log")', under tandem run: '$(accuracy "$work/fm-tandem.log")'"
echo "srun -N1 -n2 fashion_mnist:        $(accuracy "$work/fm-srun.log")  (tandem run: $(accuracy "$work/fm-tandem.log"))"

# sbatch: our launcher inside the allocation, as docs/cluster.md shows it.
timeout -k 5 180 sbatch --wait -N1 -n2 -o "$work/sbatch.out" \
  --wrap "$tandem run --nproc-per-node 2 -- $train_ddp --epochs 1" >"$work/sbatch.log" 2>&1 ||
  { fail "sbatch --wait exited $?"; show_log "$work/sbatch.log"; show_log "$work/sbatch.out"; }
[[ "$(checksum "$work/sbatch.out")" == "$reference" ]] || fail "sbatch + tandem run: '$(checksum "$work/sbatch.out")', tandem run: '$reference'"
echo "sbatch --wait (tandem run inside): $(checksum "$work/sbatch.out")"

(( status == 0 )) || slurm_show_logs
dir="$SLURM_DIR"
slurm_stop
if leftover=$(pgrep -af "$dir"); then fail "daemons left after slurm_stop: $leftover"; fi
(( status == 0 )) && echo "Slurm started Tandem's programs: srun (Gloo and PMIx/MPI), sbatch + tandem run; the results equal tandem run's"
exit $status
