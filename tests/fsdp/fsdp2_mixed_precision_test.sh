#!/usr/bin/env bash
# Tandem's FSDP mixed precision against PyTorch FSDP2's, on the same data and initial weights, at
# W processes (Gloo): Tandem's runs under `tandem run`, FSDP2's under torchrun from the venv
# (tests/fsdp/fsdp2_mixed_precision.py says what is compared).
#   fsdp2_mixed_precision_test.sh TANDEM RUN_TOOL PYTHON W
set -euo pipefail
tandem="$1"; tool="$2"; python="$3"; world="$4"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
# The bfloat16 reduction at 2 processes only (fsdp2_mixed_precision.py says why).
reduces=(fp32); bf16="-"
if [[ "$world" == 2 ]]; then reduces+=(bf16); bf16="$work/tandem-bf16.safetensors"; fi
for reduce in "${reduces[@]}"; do
  "$tandem" run --nproc-per-node "$world" -- "$tool" "$work/init.safetensors" "$work/tandem-$reduce.safetensors" "$reduce"
done
source "$here/../support/free_port.sh"
"$(dirname "$python")/torchrun" --nproc-per-node "$world" --master-port "$(free_port)" "$here/fsdp2_mixed_precision.py" \
  "$work/init.safetensors" "$bf16" "$work/tandem-fp32.safetensors"
