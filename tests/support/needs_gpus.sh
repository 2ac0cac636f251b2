#!/usr/bin/env bash
# needs_gpus.sh N TANDEM COMMAND...: runs COMMAND where at least N CUDA devices are visible (as
# `TANDEM env` counts them); otherwise says why and exits 77, ctest's skip code for tandem_gpu_test.
set -uo pipefail
need=$1 tandem=$2
shift 2
env_out=$("$tandem" env 2>&1); env_rc=$?
# A `tandem env` that fails is a failure, not a skip that would hide it.
(( env_rc == 0 )) || { echo "$env_out"; echo "FAIL: $tandem env exited $env_rc"; exit 1; }
have=$(awk '$1 == "cuda" && $2 == "devices" {print $3}' <<<"$env_out")
if (( ${have:-0} < need )); then
  echo "[  SKIPPED ] needs $need CUDA devices, ${have:-0} visible"
  exit 77
fi
exec "$@"
