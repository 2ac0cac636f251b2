# Helpers for the real-launcher tests (sourced). Each test prints what the launcher printed, the
# exit status and the time it took, then checks them.
source "$(dirname "${BASH_SOURCE[0]}")/../support/logs.sh"  # show_log, scratch_dir, on_exit
source "$(dirname "${BASH_SOURCE[0]}")/../support/free_port.sh"  # below the ephemeral range


# parse_expect ARGS...: reads leading `--expect REGEX` pairs into the array `expect`; the
# arguments after `--` are left in the array `command`.
parse_expect() {
  expect=()
  while [[ $# -gt 0 && "$1" == --expect ]]; do expect+=("$2"); shift 2; done
  [[ "${1:-}" == "--" ]] && shift
  command=("$@")
}

# expect_success SECONDS COMMAND...: COMMAND must exit 0 within SECONDS and its output must match
# every extended regex in the array `expect`.
expect_success() {
  local limit="$1"; shift
  local out; out="$(mktemp)"
  local start; start=$(date +%s%N)
  echo "\$ $*"
  timeout --kill-after=5 "$limit" "$@" > "$out" 2>&1
  local rc=$?
  local elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  tail -n 60 "$out"  # the whole of it when a check below fails
  echo "ecosystem: exit $rc after ${elapsed_ms} ms (limit ${limit} s)"
  local ok=1
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "FAIL: the command hung (killed after ${limit} s)"; ok=0
  elif [[ $rc -ne 0 ]]; then echo "FAIL: exit status $rc"; ok=0; fi
  local re
  for re in "${expect[@]}"; do
    grep -Eq -- "$re" "$out" || { echo "FAIL: no line matches: $re"; ok=0; }
  done
  [[ $ok -eq 1 ]] || show_log "$out"
  rm -f "$out"
  [[ $ok -eq 1 ]] && { echo "ecosystem: ok"; return 0; }
  return 1
}
