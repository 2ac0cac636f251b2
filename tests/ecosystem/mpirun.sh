#!/usr/bin/env bash
# mpirun.sh MODE [--expect REGEX]... -- PROGRAM [ARGS...]
# Debian's Open MPI mpirun starts a Tandem program as 2 ranks; Tandem reads OMPI_COMM_WORLD_*.
# The program never calls MPI_Init: mpirun is only the launcher. MODE:
#   ok                 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=<free port>: must succeed
#   no-master-addr     neither exported: must fail at once with the message naming them
# --allow-run-as-root: CI runs as root; --oversubscribe: 2 ranks even where there is 1 core.
# Exit 77 (ctest: skipped) only when mpirun is not installed (scripts/setup installs openmpi-bin).
set -u
source "$(dirname "$0")/lib.sh"
mode="$1"; shift
parse_expect "$@"
mpirun="$(command -v mpirun)" || { echo "SKIPPED: no mpirun on PATH (Debian: openmpi-bin; scripts/setup installs it)"; exit 77; }
launcher=("$mpirun" --allow-run-as-root --oversubscribe -np 2)
case "$mode" in
  ok)
    port="$(free_port)" || exit 1
    expect_success 50 "${launcher[@]}" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" "${command[@]}" ;;
  no-master-addr)
    exec "$(dirname "$0")/../expect_failure.sh" 30 "${expect[0]}" env -u MASTER_ADDR -u MASTER_PORT \
      "${launcher[@]}" "${command[@]}" ;;
  *) echo "mpirun.sh: unknown mode '$mode'"; exit 2 ;;
esac
