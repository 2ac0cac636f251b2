#!/bin/sh
# in_memory_cgroup.sh CG_ROOT LIMIT_FILE LIMIT_BYTES PROGRAM [ARGS...]: run PROGRAM as this rank
# under a memory budget. Started by `tandem run` once per rank (it sets RANK): makes the cgroup
# CG_ROOT/rank$RANK, writes LIMIT_BYTES to its LIMIT_FILE (cgroup v1 memory.limit_in_bytes, v2
# memory.max), moves this process into it and execs PROGRAM, so the kernel kills the rank (SIGKILL
# from the cgroup's OOM killer) when it needs more. LIMIT_BYTES 0: no budget, PROGRAM runs as is.
# Used by `tandem bench --memory-budget` and tests/fsdp/memory_budget_test.sh.
if [ "$3" != 0 ]; then
  cg="$1/rank$RANK"
  mkdir -p "$cg" && echo "$3" > "$cg/$2" && echo $$ > "$cg/cgroup.procs" ||
    { echo "in_memory_cgroup.sh: cannot put rank $RANK in a memory cgroup under $1" >&2; exit 3; }
fi
shift 3
exec "$@"
