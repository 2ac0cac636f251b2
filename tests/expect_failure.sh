#!/usr/bin/env bash
# expect_failure.sh SECONDS REGEX COMMAND...: passes when COMMAND exits non-zero within SECONDS
# and its output matches the extended REGEX. For failure paths that must end a job cleanly.
set -u
limit="$1"; pattern="$2"; shift 2
source "$(dirname "$0")/support/logs.sh"
scratch_dir work  # the whole output is printed when a check fails
out="$work/command.out"
start=$(date +%s%N)
timeout --kill-after=5 "$limit" "$@" > "$out" 2>&1; rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
tail -n 20 "$out"  # the whole of it when a check below fails
echo "expect_failure: exit $rc after ${elapsed_ms} ms (limit ${limit} s)"
if [[ $rc -eq 0 ]]; then echo "FAIL: the command succeeded"; exit 1; fi
if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "FAIL: the command hung (killed after ${limit}s)"; exit 1; fi
if ! grep -Eq "$pattern" "$out"; then echo "FAIL: no line matches: $pattern"; exit 1; fi
echo "expect_failure: ok"
