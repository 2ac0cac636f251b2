#!/usr/bin/env bash
# torchrun.sh MODE TORCHRUN [--expect REGEX]... -- PROGRAM [ARGS...]
# PyTorch's own torchrun starts a Tandem program as 2 local workers (--no-python). MODE:
#   static      --nnodes 1 --master-addr 127.0.0.1 --master-port <free port>
#   standalone  --standalone
#   c10d        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:<free port>
#   restart     static with --max-restarts 1 and TANDEM_TEST_FAIL_ON_ATTEMPT=0: the program
#               (collectives_test) fails its first attempt after writing keys in the agent's store;
#               the second attempt must rendezvous in that same store without seeing them.
# Exit 77 (ctest: skipped) only when TORCHRUN does not exist.
set -u
source "$(dirname "$0")/lib.sh"
mode="$1"; torchrun="$2"; shift 2
parse_expect "$@"
if [[ ! -x "$torchrun" ]]; then
  echo "SKIPPED: no torchrun at $torchrun (scripts/setup installs the torch wheel into .venv)"
  exit 77
fi
port="$(free_port)" || exit 1
case "$mode" in
  static) args=(--nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port") ;;
  standalone) args=(--standalone --nproc-per-node 2) ;;
  c10d) args=(--nnodes 1 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port") ;;
  restart)
    args=(--nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" --max-restarts 1)
    export TANDEM_TEST_FAIL_ON_ATTEMPT=0 TANDEM_TEST_COLLECTIVE_TIMEOUT_MS=15000 ;;
  *) echo "torchrun.sh: unknown mode '$mode'"; exit 2 ;;
esac
expect_success 50 "$torchrun" "${args[@]}" --no-python "${command[@]}"
