#!/usr/bin/env bash
# Two "hosts" made with network namespaces joined by a veth pair, two ranks each: the collectives
# cross a real (virtual) network, and the store and Gloo bind non-loopback addresses.
# Exit 77 (ctest: skipped) where the machine refuses namespaces.
# netns_test.sh TANDEM WORKER [GTEST_FILTER]: the worker's tests run as 4 ranks on the 2 hosts.
set -u
TANDEM="$1"; WORKER="$2"
A=tandem_test_a_$$; B=tandem_test_b_$$
ADDR_A=10.231.$(( $$ % 250 )).1; ADDR_B=10.231.$(( $$ % 250 )).2; PORT=29611

cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; }
trap cleanup EXIT
if ! ip netns add "$A" 2>/dev/null || ! ip netns add "$B" 2>/dev/null; then
  echo "SKIPPED: this machine refuses network namespaces (ip netns add failed; needs root / CAP_SYS_ADMIN)"
  exit 77
fi
set -e
ip link add "va$$" netns "$A" type veth peer name "vb$$" netns "$B"
ip -n "$A" addr add "$ADDR_A/24" dev "va$$"; ip -n "$B" addr add "$ADDR_B/24" dev "vb$$"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "va$$" up; ip -n "$B" link set "vb$$" up
set +e

common=(--nnodes 2 --nproc-per-node 2 --master-addr "$ADDR_A" --master-port "$PORT" --run-id netns-test)
filter="${3:---gtest_filter=Collectives.AllReduce*:Collectives.Broadcast*:Collectives.AllGather*:Collectives.Barrier*}"
ip netns exec "$A" "$TANDEM" run "${common[@]}" --node-rank 0 -- "$WORKER" "$filter" > "${TMPDIR:-/tmp}/netns_a_$$.log" 2>&1 &
pid_a=$!
ip netns exec "$B" "$TANDEM" run "${common[@]}" --node-rank 1 -- "$WORKER" "$filter" > "${TMPDIR:-/tmp}/netns_b_$$.log" 2>&1 &
pid_b=$!
wait $pid_a; rc_a=$?
wait $pid_b; rc_b=$?
echo "=== node 0 ($ADDR_A) ==="; tail -n 30 "${TMPDIR:-/tmp}/netns_a_$$.log"
echo "=== node 1 ($ADDR_B) ==="; tail -n 30 "${TMPDIR:-/tmp}/netns_b_$$.log"
rm -f "${TMPDIR:-/tmp}/netns_a_$$.log" "${TMPDIR:-/tmp}/netns_b_$$.log"
# The world really was 4 ranks over two hosts.
[[ $rc_a -eq 0 && $rc_b -eq 0 ]] && { echo "netns: 2 hosts x 2 ranks passed"; exit 0; }
echo "netns: FAILED (node 0 rc=$rc_a, node 1 rc=$rc_b)"; exit 1
