# What the launcher fault scripts share (sourced). Every wait is bounded: a test fails, never hangs.
# Times are CLOCK_REALTIME nanoseconds, as fault_trainer writes them.
export LC_ALL=C  # EPOCHREALTIME with a '.'
source "$(dirname "${BASH_SOURCE[0]}")/../support/logs.sh"  # scratch_dir: logs printed on failure
source "$(dirname "${BASH_SOURCE[0]}")/../support/free_port.sh"

fail() { echo "FAIL: $*"; exit 1; }
now_ns() { local t="$EPOCHREALTIME"; echo "${t/./}000"; }
ms_between() { echo $(( ($2 - $1) / 1000000 )); }

# Each line of stdin, prefixed with the time it arrived: the launcher's notes, timed.
stamp() { local line t; while IFS= read -r line; do t="$EPOCHREALTIME"; printf '%s %s\n' "${t/./}000" "$line"; done; }

# start_job LOG LIMIT CMD...: CMD in the background, stdout and stderr stamped into LOG; JOB is the
# waiting subshell. CMD gets SIGKILL after LIMIT seconds (a launcher dies with its workers).
start_job() {
  local log="$1" limit="$2"; shift 2
  ( timeout -s KILL "$limit" "$@" 2>&1 | stamp > "$log"; exit "${PIPESTATUS[0]}" ) &
  JOB=$!
}
# finish_job: waits for JOB and sets RC to CMD's exit code; a job killed at its limit fails the test.
finish_job() {
  wait "$JOB"; RC=$?
  [[ $RC -ne 137 ]] || fail "a job hung and was killed at its time limit"
}
run_job() { start_job "$@"; finish_job; }

# The time of the first line of LOG that contains TEXT (empty when none).
time_of() { grep -F -- "$2" "$1" | head -1 | cut -d' ' -f1; }

# wait_for FILE SECONDS: fails unless FILE appears in time.
wait_for() {
  local i
  for ((i = 0; i < $2 * 20; ++i)); do [[ -e "$1" ]] && return 0; sleep 0.05; done
  fail "$1 did not appear within $2 s"
}

# last_trace_step TRACE: the number of fault_trainer's last `step` line in TRACE (empty when none).
last_trace_step() { grep -h '^step ' "$1" 2>/dev/null | tail -1 | cut -d' ' -f2; }
# wait_trace_step TRACE STEP SECONDS PID: until TRACE reaches STEP; fails when PID (the job that
# writes it) ends first, or when the time runs out.
wait_trace_step() {
  local i last
  for ((i = 0; i < $3 * 10; ++i)); do
    last=$(last_trace_step "$1")
    (( ${last:-0} >= $2 )) && return 0
    kill -0 "$4" 2>/dev/null || fail "the job ended before $(basename "$1") reached step $2"
    sleep 0.1
  done
  fail "$(basename "$1") did not reach step $2 within $3 s"
}

# The launcher of a worker: its parent process.
parent_of() { awk '{ print $4 }' "/proc/$1/stat"; }

# A line of a trace: `step N ...` (or `final ...`); compare_step TRACE REF N fails unless equal.
trace_line() { grep -m1 -- "^$2\( \|$\)" "$1"; }
compare_step() {
  local got want
  got="$(trace_line "$1" "$3")"; want="$(trace_line "$2" "$3")"
  [[ -n "$want" ]] || fail "the reference $2 has no line '$3'"
  [[ -n "$got" ]] || fail "$1 has no line '$3'"
  [[ "$got" == "$want" ]] && return 0
  local words; words="$(diff <(tr ' ' '\n' <<<"$got") <(tr ' ' '\n' <<<"$want"))"
  echo "the first differing words of '$3' (< $1, > $2):"
  head -n 12 <<<"$words"
  fail "$1: '$3' differs from the uninterrupted run's ($2) in $(grep -c '^<' <<<"$words") of $(wc -w <<<"$got") words"
}

# No process of these pids is alive any more (kill -0 fails for each).
expect_gone() {
  local pid
  for pid in "$@"; do
    [[ -n "$pid" ]] || fail "a pid is missing"
    ! kill -0 "$pid" 2>/dev/null || fail "pid $pid is still alive"
  done
}

