# Sourced by the network-namespace tests: two "hosts", namespaces A and B joined by a veth pair.
# two_hosts TAG OCTET sets A and B (the namespaces), NET (10.OCTET.<pid % 250>), ADDR_A and ADDR_B
# (NET.1 and NET.2) and work (a temporary folder whose logs are printed if the test fails), and
# removes them all at exit. Exits 77 (ctest: skipped) where the machine refuses namespaces (needs
# root / CAP_SYS_ADMIN), 1 if the link fails.
source "$(dirname "${BASH_SOURCE[0]}")/logs.sh"
two_hosts() {
  A=tandem_${1}_a_$$; B=tandem_${1}_b_$$
  NET=10.$2.$(( $$ % 250 )); ADDR_A=$NET.1; ADDR_B=$NET.2
  scratch_dir work
  on_exit 'ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null'
  local why
  if ! why="$(ip netns add "$A" 2>&1 && ip netns add "$B" 2>&1)"; then
    echo "SKIPPED: this machine refuses network namespaces (ip netns add: ${why:-failed}; needs root / CAP_SYS_ADMIN)"
    exit 77
  fi
  # Created inside the namespaces, so the names never meet another test's.
  { ip link add "ha$$" netns "$A" type veth peer name "hb$$" netns "$B" &&
    ip -n "$A" addr add "$ADDR_A/24" dev "ha$$" && ip -n "$B" addr add "$ADDR_B/24" dev "hb$$" &&
    ip -n "$A" link set lo up && ip -n "$B" link set lo up &&
    ip -n "$A" link set "ha$$" up && ip -n "$B" link set "hb$$" up; } || { echo "FAIL: could not link the two namespaces"; exit 1; }
}
