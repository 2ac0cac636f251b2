#!/usr/bin/env bash
# Two "hosts" made with network namespaces joined by a veth pair, two ranks each, started by one
# `tandem run --backend mpi --hosts A,B` in host A: Open MPI's mpirun starts host B's ranks through
# its rsh agent (here `ip netns exec B` instead of ssh), and the ranks of different hosts talk
# MPI over TCP across the veth pair (shared memory only within a host).
# Exit 77 (ctest: skipped) where the machine refuses namespaces.
# netns_mpi_test.sh TANDEM WORKER [WORKER ARGS...]
set -u
TANDEM="$1"; shift
source "$(dirname "$0")/../support/two_hosts.sh"
two_hosts mpi 232

# mpirun calls the agent as `AGENT HOST COMMAND...`, as it would call ssh. A real second host
# also has its own /dev/shm: Open MPI names its shared-memory segments there by hostname, job and
# local rank, and both "hosts" here share one hostname, so host B's ranks would map host A's
# segments (seen: a segfault in MPI_Comm_dup, one run in three). Host B gets a private one.
cat > "$work/netns_agent" <<AGENT
#!/bin/sh
host="\$1"; shift
case "\$host" in
  $ADDR_B) exec ip netns exec $B unshare --mount --propagation private /bin/sh -c \
             'mount -t tmpfs tmpfs /dev/shm && exec /bin/sh -c "\$0"' "\$*" ;;
  *) echo "netns_agent: unknown host \$host" >&2; exit 255 ;;
esac
AGENT
chmod +x "$work/netns_agent"

# Out-of-band and MPI traffic over the veth pair only (loopback would look like a shared host).
export OMPI_MCA_plm_rsh_agent="$work/netns_agent"
export OMPI_MCA_oob_tcp_if_include="$NET.0/24" OMPI_MCA_btl_tcp_if_include="$NET.0/24"
start=$(date +%s)
ip netns exec "$A" timeout --kill-after=5 240 "$TANDEM" run --backend mpi --hosts "$ADDR_A,$ADDR_B" --nproc-per-node 2 \
  --master-addr "$ADDR_A" -- "$@" > "$work/out.log" 2>&1
rc=$?
tail -n 40 "$work/out.log"
echo "netns_mpi: exit $rc after $(( $(date +%s) - start )) s"
[[ $rc -eq 0 ]] || { echo "netns_mpi: FAILED"; exit 1; }
echo "netns_mpi: 2 hosts x 2 ranks over MPI passed"
