#!/usr/bin/env bash
# agent_store.sh MODE PYTHON [--expect REGEX]... -- PROGRAM [ARGS...]
# A c10d TCPStore already serves MASTER_PORT, as torchrun's agent does (started here with PYTHON's
# torch), and workers are started by hand next to it. MODE:
#   busy     rank 0 without TORCHELASTIC_USE_AGENT_STORE: must fail within seconds with the one-line
#            busy-port message that says what to do in both cases
#   client   ranks 0 and 1 with TORCHELASTIC_USE_AGENT_STORE=True: both connect to it and succeed
# Exit 77 (ctest: skipped) only when PYTHON does not exist.
set -u
source "$(dirname "$0")/lib.sh"
mode="$1"; python="$2"; shift 2
parse_expect "$@"
[[ -x "$python" ]] || { echo "SKIPPED: no Python with torch at $python (scripts/setup makes .venv)"; exit 77; }

scratch_dir work  # the store's and rank 1's output are printed on failure
portfile="$work/store.out"
"$python" - > "$portfile" 2>&1 <<'PY' &
import datetime, time
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                 timeout=datetime.timedelta(seconds=60), multi_tenant=True)
print(store.port, flush=True)
time.sleep(60)
PY
store_pid=$!
on_exit 'kill "$store_pid" 2>/dev/null; wait "$store_pid" 2>/dev/null'
for _ in $(seq 200); do
  port="$(grep -Eom1 '^[0-9]+$' "$portfile")" && break
  kill -0 "$store_pid" 2>/dev/null || break
  sleep 0.1
done
[[ -n "${port:-}" ]] || { echo "FAIL: the Python TCPStore did not start"; exit 1; }
echo "a Python TCPStore serves 127.0.0.1:$port (pid $store_pid)"

env_of() { echo RANK="$1" WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port"; }
case "$mode" in
  busy)
    "$(dirname "$0")/../expect_failure.sh" 20 "${expect[0]}" env $(env_of 0) "${command[@]}" ;;
  client)
    # Rank 1 in the background, rank 0 in front; both must succeed.
    # Bounded, so that a hung rank 1 fails the test with its log rather than meeting ctest's kill.
    timeout -k 5 40 env $(env_of 1) TORCHELASTIC_USE_AGENT_STORE=True "${command[@]}" > "$work/rank1.log" 2>&1 &
    rank1=$!
    expect_success 40 env $(env_of 0) TORCHELASTIC_USE_AGENT_STORE=True "${command[@]}"; rc=$?
    wait "$rank1"; rc1=$?
    echo "--- rank 1 (exit $rc1):"; tail -n 20 "$work/rank1.log"  # whole, with the store's, on failure
    [[ $rc -eq 0 && $rc1 -eq 0 ]] ;;
  *) echo "agent_store.sh: unknown mode '$mode'"; exit 2 ;;
esac
