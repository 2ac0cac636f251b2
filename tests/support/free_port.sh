# Sourced by the tests that choose a port themselves. free_port prints a TCP port that no socket
# of this host uses at the moment (by /proc/net/tcp{,6}), drawn at random below the kernel's
# ephemeral range as the launcher does (Note [Free port], src/comm/net.cpp): a port from that range
# can be taken by any outgoing connection between this draw and the bind that uses it.
# torchrun's 29400-29599 is left out. Where the ephemeral range leaves no room below it (it starts
# under 22000), the draw is from 20000-59999, as the launcher then lets the kernel choose.
free_port() {
  local low used port span
  read -r low _ < /proc/sys/net/ipv4/ip_local_port_range || low=32768
  span=$(( low - 20000 ))
  (( span >= 2000 )) || span=40000
  used="$(awk 'FNR > 1 { n = split($2, a, ":"); print a[n] }' /proc/net/tcp /proc/net/tcp6 | sort -u)"  # hex ports
  while :; do
    port=$(( 20000 + (RANDOM * 32768 + RANDOM) % span ))
    (( port >= 29400 && port < 29600 )) && continue
    grep -qx "$(printf '%04X' "$port")" <<<"$used" || { echo "$port"; return 0; }
  done
}
