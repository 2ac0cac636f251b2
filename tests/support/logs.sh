# Sourced by the tests that keep their children's output in a temporary folder, so that a failure
# shows what failed before the folder goes (a log deleted unread is a flaky test nobody can
# diagnose).
#
# scratch_dir VAR   makes a temporary folder, stores its path in VAR and owns the EXIT trap: when
#                   the script exits non-zero, every *.log, *.out and *.err file under the folder
#                   is printed, named, before the folder is removed. TANDEM_TEST_KEEP=1 keeps the
#                   folder instead (its path is printed).
# on_exit CMD       a command the trap runs first (namespaces to delete, jobs to kill): a second
#                   `trap ... EXIT` would replace this one and lose the logs.
# show_log FILE     prints one file, named, bounded to its first 100 and last 400 lines.

_tandem_scratch=()
_tandem_on_exit=()

on_exit() { _tandem_on_exit+=("$1"); trap _tandem_exit EXIT; }

scratch_dir() {  # (no local variable: `printf -v` would set it instead of the caller's VAR)
  _tandem_scratch+=("$(mktemp -d)") || { echo "FAIL: mktemp -d"; exit 1; }
  printf -v "$1" '%s' "${_tandem_scratch[-1]}"
  trap _tandem_exit EXIT
}

show_log() {
  local lines
  lines=$(wc -l < "$1")
  echo "===== $1 ($lines lines)"
  if (( lines <= 500 )); then
    cat "$1"
  else
    head -n 100 "$1"; echo "..... ($((lines - 500)) lines left out)"; tail -n 400 "$1"
  fi
}

# Its locals are prefixed: the on_exit commands it evals see them. set +eu: nothing in the
# clean-up may end it early. 77 is ctest's skip, not a failure: no logs.
_tandem_exit() {
  local _tandem_rc=$? _tandem_cmd _tandem_dir _tandem_file
  set +eu
  for _tandem_cmd in "${_tandem_on_exit[@]}"; do eval "$_tandem_cmd"; done
  for _tandem_dir in "${_tandem_scratch[@]}"; do
    if (( _tandem_rc != 0 && _tandem_rc != 77 )); then
      while IFS= read -r _tandem_file; do show_log "$_tandem_file"; done \
        < <(find "$_tandem_dir" -type f \( -name '*.log' -o -name '*.out' -o -name '*.err' \) | sort)
    fi
    if [[ "${TANDEM_TEST_KEEP:-0}" == 1 ]]; then
      echo "kept $_tandem_dir (TANDEM_TEST_KEEP=1)"
    else
      rm -rf "$_tandem_dir"
    fi
  done
  exit "$_tandem_rc"
}
