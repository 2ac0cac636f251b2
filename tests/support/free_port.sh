# Sourced by the tests that choose a port themselves. free_port prints a TCP port that no socket
# of this host uses at the moment (by /proc/net/tcp{,6}), drawn at random below the kernel's
# ephemeral range as the launcher does (Note [Free port], src/comm/net.cpp): a port from that range
# can be taken by any outgoing connection between this draw and the bind that uses it.
# torchrun's 29400-29599 is left out.
free_port() {
  local low used port
  read -r low _ < /proc/sys/net/ipv4/ip_local_port_range || low=32768
  (( low - 20000 >= 2000 )) || { echo "free_port: the ephemeral range starts at $low: no room below it" >&2; return 1; }
  used="$(awk 'FNR > 1 { n = split($2, a, ":"); print a[n] }' /proc/net/tcp /proc/net/tcp6 | sort -u)"  # hex ports
  while :; do
    port=$(( 20000 + (RANDOM * 32768 + RANDOM) % (low - 20000) ))
    (( port >= 29400 && port < 29600 )) && continue
    grep -qx "$(printf '%04X' "$port")" <<<"$used" || { echo "$port"; return 0; }
  done
}
