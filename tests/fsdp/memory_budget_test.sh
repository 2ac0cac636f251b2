#!/usr/bin/env bash
# memory_budget_test.sh TANDEM BUDGET_TRAINER IN_MEMORY_CGROUP_SH: a model that does not fit a per-process memory
# budget under DDP and trains under FSDP, 4 ranks (docs/guide-fsdp.md, "A model larger than a
# budget"). The budget is enforced by the kernel: each rank runs in a memory cgroup of its own
# (cgroup v1 memory.limit_in_bytes, or v2 memory.max), so a rank that needs more is killed.
# First both jobs run without a budget and report their peak RSS; the budget is FSDP's peak plus
# 10 % (RSS counts shared-library pages the cgroup may not be charged for, so FSDP's own peak is a
# safe budget for it, and DDP's peak must exceed it by more than those pages: 300 MB); then DDP
# under it must be killed and FSDP must train and save its (sharded) checkpoint. Exit 77 (skipped) where
# this machine gives no writable memory cgroup.
set -u
tandem="$1"; trainer="$2"; wrapper="$3"  # wrapper: bench/in_memory_cgroup.sh
source "$(dirname "$0")/../support/memory_cgroup.sh"
make_memory_cgroup tandem-budget
work=$(mktemp -d); trap 'remove_memory_cgroup; rm -rf "$work"' EXIT

job() {  # job STRATEGY LIMIT_BYTES(0: none) -> exit status; output in $work/STRATEGY-LIMIT.log
  timeout -k 5 240 "$tandem" run --nproc-per-node 4 -- /bin/sh "$wrapper" "$cg_root" "$limit_file" "$2" \
    "$trainer" --strategy "$1" --checkpoints "$work/$1-$2.ckpt" >"$work/$1-$2.log" 2>&1
}
peak() { grep -o 'peak RSS [0-9]*' "$work/$1-0.log" | awk '{print $3}' | sort -n | tail -1; }

for s in ddp fsdp; do
  job "$s" 0 || { echo "FAIL: $s without a budget exited $?"; cat "$work/$s-0.log"; exit 1; }
done
ddp=$(peak ddp); fsdp=$(peak fsdp)
budget=$(( fsdp + fsdp / 10 ))
printf '%-6s %-22s %s\n' strategy "peak RSS, no budget" "under a budget of $budget MB per process"
(( budget + 300 < ddp )) || { echo "FAIL: FSDP's peak ($fsdp MB) is not well below DDP's ($ddp MB)"; exit 1; }
job ddp $(( budget * 1024 * 1024 )); ddp_status=$?
job fsdp $(( budget * 1024 * 1024 )); fsdp_status=$?
ddp_result="killed (exit $ddp_status)"; (( ddp_status == 0 )) && ddp_result="trained"
fsdp_result="trained"; (( fsdp_status != 0 )) && fsdp_result="failed (exit $fsdp_status)"
printf '%-6s %-22s %s\n' ddp "$ddp MB" "$ddp_result" fsdp "$fsdp MB" "$fsdp_result"
grep -h 'trained 3 steps' "$work/fsdp-$(( budget * 1024 * 1024 )).log" | sed 's/^/  /'
status=0
(( ddp_status != 0 )) || { echo "FAIL: DDP fit the budget it should not fit"; status=1; }
# Killed by the kernel for the budget (SIGKILL from the cgroup's OOM killer), not failed otherwise.
if (( ddp_status != 0 )) && ! grep -q "failed with signal 9 (Killed)" "$work/ddp-$(( budget * 1024 * 1024 )).log"; then
  echo "FAIL: DDP failed, but not killed for memory:"; tail -3 "$work/ddp-$(( budget * 1024 * 1024 )).log"; status=1
fi
(( fsdp_status == 0 )) || { echo "FAIL: FSDP did not train under the budget"; tail -5 "$work/fsdp-$(( budget * 1024 * 1024 )).log"; status=1; }
# Its checkpoint, written within the budget: every rank's rows, no whole model anywhere.
if (( fsdp_status == 0 )); then
  info=$("$tandem" checkpoint info "$work/fsdp-$(( budget * 1024 * 1024 )).ckpt" 2>&1) &&
    grep -q "model_0.rank\*.safetensors, sharded in 4 files: 24 tensors, 50356224 elements" <<<"$info" &&
    echo "  checkpoint saved under the budget: $(grep '^model 0' <<<"$info")" ||
    { echo "FAIL: FSDP's checkpoint under the budget: $info"; status=1; }
fi
(( status == 0 )) && echo "a model over the budget under DDP trains under FSDP (budget $budget MB per process, enforced by a memory cgroup)"
exit $status
