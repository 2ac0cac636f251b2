#!/usr/bin/env bash
# Two "hosts" made with network namespaces joined by a veth pair, two ranks each: the collectives
# cross a real (virtual) network, and the store and Gloo bind non-loopback addresses.
# Exit 77 (ctest: skipped) where the machine refuses namespaces.
# netns_test.sh TANDEM WORKER [GTEST_FILTER]: the worker's tests run as 4 ranks on the 2 hosts.
set -u
TANDEM="$1"; WORKER="$2"
source "$(dirname "$0")/../support/two_hosts.sh"
two_hosts test 231
PORT=29611

common=(--nnodes 2 --nproc-per-node 2 --master-addr "$ADDR_A" --master-port "$PORT" --run-id netns-test)
filter="${3:---gtest_filter=Collectives.AllReduce*:Collectives.Broadcast*:Collectives.AllGather*:Collectives.Barrier*}"
# Bounded: a hung node fails the test with its log (the trap prints both whole on failure).
ip netns exec "$A" timeout -k 5 240 "$TANDEM" run "${common[@]}" --node-rank 0 -- "$WORKER" "$filter" > "$work/node0.log" 2>&1 &
pid_a=$!
ip netns exec "$B" timeout -k 5 240 "$TANDEM" run "${common[@]}" --node-rank 1 -- "$WORKER" "$filter" > "$work/node1.log" 2>&1 &
pid_b=$!
wait $pid_a; rc_a=$?
wait $pid_b; rc_b=$?
echo "=== node 0 ($ADDR_A) ==="; tail -n 30 "$work/node0.log"
echo "=== node 1 ($ADDR_B) ==="; tail -n 30 "$work/node1.log"
# The world really was 4 ranks over two hosts.
[[ $rc_a -eq 0 && $rc_b -eq 0 ]] && { echo "netns: 2 hosts x 2 ranks passed"; exit 0; }
echo "netns: FAILED (node 0 rc=$rc_a, node 1 rc=$rc_b)"; exit 1
