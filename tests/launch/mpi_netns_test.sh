#!/usr/bin/env bash
# mpi_netns_test.sh TANDEM: `tandem run --backend mpi --hosts A,B --nproc-per-node 2` on two
# "hosts" made with network namespaces joined by a veth pair. The launcher runs once, in A;
# mpirun starts B's ranks itself through OMPI_MCA_plm_rsh_agent (a script standing in for ssh that
# enters B). Passes when ranks 0,1 run in A and 2,3 in B, each with local rank 0/1 of 2, and all
# four see MASTER_ADDR=A and one MASTER_PORT. Exit 77 (skipped) without mpirun or namespaces.
set -u
tandem="$1"
command -v mpirun > /dev/null || { echo "SKIPPED: no mpirun on PATH (Debian: openmpi-bin)"; exit 77; }
source "$(dirname "$0")/../support/two_hosts.sh"
two_hosts lmpi 233
net=$NET
# ssh's stand-in: `agent [-options] HOST COMMAND...` runs COMMAND through a shell in B.
cat > "$work/agent.sh" <<AGENT
#!/bin/bash
while [[ \$1 == -* ]]; do shift; done
shift
exec ip netns exec "$B" sh -c "\$*"
AGENT
cat > "$work/where.sh" <<'WHERE'
#!/bin/bash
addr="$(ip -4 -o addr show scope global | awk '{ print $4 }' | cut -d/ -f1 | head -1)"
echo "rank $OMPI_COMM_WORLD_RANK local $OMPI_COMM_WORLD_LOCAL_RANK/$OMPI_COMM_WORLD_LOCAL_SIZE at $addr master $MASTER_ADDR:$MASTER_PORT"
WHERE
chmod +x "$work/agent.sh" "$work/where.sh"
out="$work/out.log"
OMPI_MCA_plm_rsh_agent="$work/agent.sh" timeout -s KILL 60 ip netns exec "$A" \
  "$tandem" run --backend mpi --hosts "$ADDR_A,$ADDR_B" --nproc-per-node 2 -- "$work/where.sh" > "$out" 2>&1
rc=$?
cat "$out"
fail() { echo "FAIL: $*"; exit 1; }
[[ $rc -eq 0 ]] || fail "tandem run exited $rc"
grep -q -- "--host $ADDR_A:2,$ADDR_B:2 --map-by ppr:2:node" "$out" || fail "mpirun did not get --host/--map-by"
port="$(grep -m1 -o "master $ADDR_A:[0-9]*" "$out" | cut -d: -f2)"
[[ -n "$port" ]] || fail "no rank saw MASTER_ADDR=$ADDR_A"
expect=("0 local 0/2 at $ADDR_A" "1 local 1/2 at $ADDR_A" "2 local 0/2 at $ADDR_B" "3 local 1/2 at $ADDR_B")
for r in 0 1 2 3; do
  grep -qx "\[rank$r\]: rank ${expect[$r]} master $ADDR_A:$port" "$out" || fail "rank $r: expected 'rank ${expect[$r]} master $ADDR_A:$port'"
done
echo "mpi netns: ok: ranks 0,1 in $ADDR_A and 2,3 in $ADDR_B, started by one launcher, one store address"
