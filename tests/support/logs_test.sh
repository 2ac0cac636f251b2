#!/usr/bin/env bash
# logs_test.sh: tests/support/logs.sh, which every multi-process script relies on to show what
# failed. A script that exits non-zero prints each log of its scratch folder, keeps its exit
# status, runs its on_exit commands and removes the folder; one that exits 0 prints none of it.
set -u
support="$(cd "$(dirname "$0")" && pwd)"
scratch="$(mktemp -d)"; trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
unset TANDEM_TEST_KEEP  # the cases below set it where they mean it

# child STATUS: a script with a scratch folder holding two logs and a trace that is not a log.
child() {
  # Its folder's variable is `dir`, a name the helper could shadow.
  bash -c 'set -u; source "$1/logs.sh"; scratch_dir dir; echo "$dir" > "$2/where"
           on_exit "echo on_exit ran"
           echo "rank 0 said this" > "$dir/rank0.log"; mkdir "$dir/logs"; echo "rank 1 said that" > "$dir/logs/r1.err"
           echo "not a log" > "$dir/trace"; exit "$3"' child "$support" "$scratch" "$1"
}

out="$(child 3 2>&1)"; rc=$?
echo "$out"
[[ $rc -eq 3 ]] || fail "a failing script's status became $rc, not 3"
grep -qx "rank 0 said this" <<<"$out" || fail "the failing script's rank0.log was not printed"
grep -qx "rank 1 said that" <<<"$out" || fail "the log in a subfolder was not printed"
grep -q "not a log" <<<"$out" && fail "a file that is not a log was printed"
grep -qx "on_exit ran" <<<"$out" || fail "on_exit's command did not run"
[[ ! -e "$(cat "$scratch/where")" ]] || fail "the scratch folder was left behind after a failure"

out="$(child 0 2>&1)"; rc=$?
[[ $rc -eq 0 ]] || fail "a passing script's status became $rc"
grep -q "said" <<<"$out" && fail "a passing script printed its logs: $out"
[[ ! -e "$(cat "$scratch/where")" ]] || fail "the scratch folder was left behind"

out="$(TANDEM_TEST_KEEP=1 child 1 2>&1)"
kept="$(cat "$scratch/where")"
[[ -d "$kept" ]] && grep -q "kept $kept" <<<"$out" || fail "TANDEM_TEST_KEEP=1 did not keep the folder"
rm -rf "$kept"
echo "logs_test: ok"
