#!/usr/bin/env bash
# expect_one_line.sh REGEX COMMAND...: passes when COMMAND exits 2 (bad input) within 20 s having
# printed exactly one line, and that line matches the extended REGEX: `tandem plan`'s promise for
# every bad input.
set -u
pattern="$1"; shift
out=$(timeout --kill-after=5 20 "$@" 2>&1); rc=$?
echo "$out"
echo "expect_one_line: exit $rc"
[[ $rc -eq 2 ]] || { echo "FAIL: exit $rc, not 2"; exit 1; }
[[ $(printf '%s\n' "$out" | wc -l) -eq 1 ]] || { echo "FAIL: more than one line"; exit 1; }
grep -Eq "$pattern" <<<"$out" || { echo "FAIL: the line does not match: $pattern"; exit 1; }
echo "expect_one_line: ok"
