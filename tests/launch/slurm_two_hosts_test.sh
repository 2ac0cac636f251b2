#!/usr/bin/env bash
# slurm_two_hosts_test.sh TANDEM TRAIN_DDP: one Slurm job across two hosts. Two network-namespace
# hosts (tests/support/two_hosts.sh), slurmctld and slurmd `nodea` in A, slurmd `nodeb` in B
# (tests/support/slurm.sh, slurm_start_two_hosts), each with 2 CPUs. `srun -N2 -n4` puts tasks 0,1
# on A and 2,3 on B; train_ddp under it finds rank 0 on nodea by itself (the first node of
# SLURM_STEP_NODELIST, resolved through the hosts' names) and ends with the weights of the same
# job under `tandem run --nproc-per-node 4`. No daemon of ours is left afterwards.
set -u
tandem="$1"; train_ddp="$2"
source "$(dirname "$0")/../support/two_hosts.sh"
source "$(dirname "$0")/../support/slurm.sh"
two_hosts slurm2 236
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TANDEM_CPU_BACKEND OMP_NUM_THREADS
slurm_start_two_hosts 2
fail() { echo "FAIL: $*"; exit 1; }
checksum() { grep -o 'identical weights (checksum [-0-9.]*)' "$1" | head -1; }

in_host "$A" timeout -k 5 60 srun -N2 -n4 sh -c \
  'echo "task $SLURM_PROCID on $(ip -4 -o addr show scope global | awk "{ print \$4 }" | cut -d/ -f1) nodes $SLURM_STEP_NODELIST"' \
  > "$work/where.out" 2>&1 || { cat "$work/where.out"; fail "srun -N2 -n4 exited non-zero"; }
sort "$work/where.out"
for t in 0 1; do grep -qx "task $t on $ADDR_A nodes nodea,nodeb" "$work/where.out" || fail "task $t is not on host A ($ADDR_A)"; done
for t in 2 3; do grep -qx "task $t on $ADDR_B nodes nodea,nodeb" "$work/where.out" || fail "task $t is not on host B ($ADDR_B)"; done

timeout -k 5 120 "$tandem" run --nproc-per-node 4 -- "$train_ddp" --epochs 1 > "$work/tandem-run.log" 2>&1 \
  || { show_log "$work/tandem-run.log"; fail "tandem run --nproc-per-node 4 train_ddp failed"; }
reference=$(checksum "$work/tandem-run.log")
in_host "$A" timeout -k 5 180 srun -N2 -n4 "$train_ddp" --epochs 1 > "$work/srun.log" 2>&1 \
  || { show_log "$work/srun.log"; slurm_show_logs; fail "srun -N2 -n4 train_ddp failed"; }
grep -q "train_ddp: 4 ranks, CPU collectives on gloo" "$work/srun.log" || { show_log "$work/srun.log"; fail "no world of 4"; }
got=$(checksum "$work/srun.log")
echo "srun -N2 -n4 train_ddp across hosts A and B: $got (tandem run on one host: $reference)"
[[ -n $reference && "$got" == "$reference" ]] || fail "the two-host job's weights differ from tandem run's"

daemons="$SLURM_DIR"
slurm_stop
left=$(pgrep -f "$daemons" || true)
[[ -z $left ]] || fail "processes of our Slurm are still alive: $left"
echo "slurm two hosts: ok"
