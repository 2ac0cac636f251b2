# Sourced by the tests that hold processes to a memory budget (tests/fsdp/memory_budget_test.sh,
# tests/bench/memory_frontier_test.sh): skips them under a sanitizer, makes a memory cgroup of
# their own, and removes it at exit. After `make_memory_cgroup NAME`: $cg_root (the cgroup; each
# rank gets $cg_root/rank$RANK from bench/in_memory_cgroup.sh) and $limit_file
# (memory.limit_in_bytes for cgroup v1, memory.max for v2). Exits 77 (skipped) where there is none.
make_memory_cgroup() {
  # The budget is about the real allocator's memory: a sanitizer's allocator (scripts/sanitize)
  # keeps freed blocks in quarantine and refuses the host allocator setting FSDP makes.
  if [[ -n ${ASAN_OPTIONS:-} || -n ${TSAN_OPTIONS:-} ]]; then
    echo "SKIP: under a sanitizer's allocator the process's memory is not what this test budgets"; exit 77
  fi
  cg_root=""
  if [[ -w /sys/fs/cgroup/memory ]] && mkdir "/sys/fs/cgroup/memory/$1-$$" 2>/dev/null; then
    cg_root="/sys/fs/cgroup/memory/$1-$$"; limit_file=memory.limit_in_bytes
  elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null && mkdir "/sys/fs/cgroup/$1-$$" 2>/dev/null; then
    cg_root="/sys/fs/cgroup/$1-$$"; limit_file=memory.max
    echo +memory > "$cg_root/cgroup.subtree_control" 2>/dev/null || true
  else
    echo "SKIP: no writable memory cgroup here (needs /sys/fs/cgroup/memory or cgroup v2 with memory)"; exit 77
  fi
}

remove_memory_cgroup() {
  [[ -n ${cg_root:-} ]] || return 0
  for d in "$cg_root"/rank*; do [[ -d $d ]] && rmdir "$d" 2>/dev/null; done
  rmdir "$cg_root" 2>/dev/null
}
