#!/usr/bin/env bash
# Test hosts on one machine: N "hosts" as network + UTS namespaces (own hostname, own network
# stack), each linked by a veth pair to a bridge that lives in a namespace of its own, so no
# address of theirs is reachable from this machine's own network, and nothing they send can leave
# it. A head namespace on the same bridge runs the launcher; an rsh agent makes
# `mpiexec -H host1,host2 ...` start each host's Open MPI daemon (and so its ranks) inside that
# host's namespaces.
#
#   scripts/test_hosts.sh run N [--rate RATE] [--slots S] -- CMD [ARGS...]
#       Creates head + host1..hostN, runs CMD in the head namespace, removes everything when CMD
#       ends (also on failure, Ctrl-C, or this script being killed: every namespace is held by a
#       process that exits once this script is gone). Exit status: CMD's.
#       --rate RATE  shapes every link in both directions with tc tbf (e.g. 1gbit, 100mbit).
#       --slots S    ranks per host in the hostfile (default 2).
#   Inside CMD (environment):
#       ZERONE_HOSTS          host1,host2,...          ZERONE_HOSTFILE  an Open MPI hostfile
#       ZERONE_HOSTS_DIR      this run's state folder  OMPI_MCA_*       the agent, the subnet
#       scripts/test_hosts.sh cut HOST      takes HOST's link down (as a pulled cable)
#       scripts/test_hosts.sh restore HOST  brings it back up
#   scripts/test_hosts.sh check   exits 0 when this machine can make test hosts, else says why.
#
# Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), unshare/nsenter (util-linux), ip and tc (iproute2),
# the veth, bridge and sch_tbf kernel features. Open MPI only: MPICH's hydra launcher takes the
# same agent with `-launcher rsh -launcher-exec "$ZERONE_HOSTS_DIR/agent"`, but this script's
# tests use Open MPI.
set -euo pipefail

SUBNET=10.213.0      # inside the isolated bridge only
HEAD_ADDR=$SUBNET.254

die() { echo "test_hosts: error: $*" >&2; exit 1; }

check() {
  [ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; return 1; }
  for tool in unshare nsenter ip tc; do
    command -v $tool >/dev/null || { echo "needs $tool"; return 1; }
  done
  # A throwaway namespace pair: can we make a veth, a bridge and a tbf qdisc?
  local out
  if ! out=$(unshare --net -- bash -c '
        ip link add zt0 type veth peer name zt1 &&
        ip link add zbr type bridge &&
        ip link set zt0 master zbr &&
        tc qdisc add dev zt1 root tbf rate 1gbit burst 128kb latency 50ms' 2>&1); then
    echo "cannot build test hosts: $out"; return 1
  fi
  return 0
}

# ---- inside a run: cut / restore a host's link
link_cmd() {
  local state="$1" host="$2"
  local dir="${ZERONE_HOSTS_DIR:?cut/restore run inside test_hosts.sh run}"
  [ -f "$dir/$host.pid" ] || die "no host '$host' in this run (hosts: ${ZERONE_HOSTS:-none})"
  nsenter -t "$(cat "$dir/switch.pid")" -n -- ip link set "p_$host" "$state"
}

# Starts a process holding new network (+UTS) namespaces; it exits once $OWNER is gone.
hold() {  # hold NAME [HOSTNAME]
  local name="$1" hostname="${2:-}" flags=(--net)
  [ -n "$hostname" ] && flags+=(--uts)
  unshare "${flags[@]}" -- bash -c '
      [ -n "$2" ] && hostname "$2"
      ip link set lo up
      while kill -0 "$1" 2>/dev/null; do sleep 0.5; done' holder "$OWNER" "$hostname" </dev/null >/dev/null 2>&1 &
  echo $! > "$DIR/$name.pid"
  PIDS+=($!)
}

in_ns() {  # in_ns NAME CMD...
  local pid; pid=$(cat "$DIR/$1.pid"); shift
  nsenter -t "$pid" -n -- "$@"
}

shape() {  # shape NAME DEV
  [ -n "$RATE" ] || return 0
  in_ns "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 256kb latency 100ms \
    || die "tc tbf with rate '$RATE' failed (expected a tc rate such as 1gbit or 100mbit)"
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # Whatever still runs in a test host's namespaces goes too: a daemon on a host whose link was cut
  # never hears the launcher's end and would otherwise outlive the run (and keep the namespace).
  local pid ns proc own_ns
  own_ns=$(readlink /proc/$$/ns/net)
  for pid in "${PIDS[@]}"; do
    ns=$(readlink "/proc/$pid/ns/net" 2>/dev/null) || continue
    [ "$ns" != "$own_ns" ] || continue  # never this machine's own network
    for proc in /proc/[0-9]*; do
      [ "${proc#/proc/}" = "$pid" ] && continue
      [ "$(readlink "$proc/ns/net" 2>/dev/null)" = "$ns" ] && kill -KILL "${proc#/proc/}" 2>/dev/null || true
    done
  done
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ -n "${DIR:-}" ] && rm -rf "$DIR"
  exit $rc
}

run() {
  local n="${1:-}"; shift || true
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "run: host count '$n' must be a number 1..200"
  RATE=""; local slots=2
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) RATE="${2:?--rate needs a value such as 1gbit}"; shift 2 ;;
      --slots) slots="${2:?--slots needs a number}"; shift 2
               [[ "$slots" =~ ^[0-9]+$ ]] && [ "$slots" -ge 1 ] || die "--slots '$slots' must be a positive number" ;;
      --) shift; break ;;
      *) die "run: unknown option '$1' (expected --rate, --slots, then -- CMD)" ;;
    esac
  done
  [ $# -gt 0 ] || die "run: no command after --"
  local why; why=$(check) || die "$why"

  OWNER=$$; PIDS=()
  DIR=$(mktemp -d /tmp/zerone-hosts.XXXXXX)
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  hold switch
  hold head head
  local hosts=()
  for i in $(seq 1 "$n"); do hold "host$i" "host$i"; hosts+=("host$i"); done
  sleep 0.2
  in_ns switch ip link add br0 type bridge
  in_ns switch ip link set br0 up
  local i=0
  for name in head "${hosts[@]}"; do
    i=$((i + 1))
    local addr="$SUBNET.$i"; [ "$name" = head ] && addr=$HEAD_ADDR
    # Made inside the switch namespace: no name ever appears in this machine's own namespace.
    in_ns switch ip link add "p_$name" type veth peer name eth0 netns "$(cat "$DIR/$name.pid")"
    in_ns switch ip link set "p_$name" master br0
    in_ns switch ip link set "p_$name" up
    in_ns "$name" ip addr add "$addr/24" dev eth0
    in_ns "$name" ip link set eth0 up
    shape "$name" eth0           # the host's sending side
    shape switch "p_$name"       # its receiving side
    echo "$addr $name" >> "$DIR/hosts"
  done
  : > "$DIR/hostfile"
  for h in "${hosts[@]}"; do echo "$h slots=$slots" >> "$DIR/hostfile"; done

  # The rsh agent: `agent HOST CMD...` runs CMD (a shell command line, as ssh would) in HOST's
  # namespaces. Open MPI calls it to start its daemon on each host.
  cat > "$DIR/agent" <<EOF
#!/usr/bin/env bash
# Open MPI (plm_rsh_agent) / MPICH (-launcher-exec) agent for test hosts in $DIR.
set -e
while [[ "\${1:-}" == -* ]]; do shift; done   # ssh-style options the launcher may add
host="\${1:?agent: no host}"; shift
[ -f "$DIR/\$host.pid" ] || { echo "test_hosts agent: no host '\$host' (hosts: ${hosts[*]})" >&2; exit 255; }
exec nsenter -t "\$(cat "$DIR/\$host.pid")" -n -u -- /bin/sh -c "\$*"
EOF
  chmod +x "$DIR/agent"

  # Wait until every host answers on the bridge.
  for h in "${hosts[@]}"; do
    local addr; addr=$(awk -v h="$h" '$2 == h {print $1}' "$DIR/hosts")
    for _ in $(seq 1 50); do in_ns head ping -c1 -W1 "$addr" >/dev/null 2>&1 && break; sleep 0.1; done
  done

  local hostlist; hostlist=$(IFS=,; echo "${hosts[*]}")
  # Open MPI: the agent, the bridge's subnet for its out-of-band and TCP transports, and a short
  # keepalive on the daemons' connections so a cut link ends the job in seconds instead of hours.
  ZERONE_HOSTS="$hostlist" ZERONE_HOSTFILE="$DIR/hostfile" ZERONE_HOSTS_DIR="$DIR" \
  OMPI_MCA_plm_rsh_agent="$DIR/agent" \
  OMPI_MCA_btl_tcp_if_include="$SUBNET.0/24" OMPI_MCA_oob_tcp_if_include="$SUBNET.0/24" \
  OMPI_MCA_oob_tcp_keepalive_time="${ZERONE_HOSTS_KEEPALIVE_S:-2}" OMPI_MCA_oob_tcp_keepalive_intvl=1 \
  OMPI_MCA_oob_tcp_keepalive_probes=3 \
    nsenter -t "$(cat "$DIR/head.pid")" -n -u -- "$@" &
  local cmd=$!
  PIDS=("$cmd" "${PIDS[@]}")
  local rc=0
  wait "$cmd" || rc=$?
  exit $rc
}

case "${1:-}" in
  run) shift; run "$@" ;;
  cut) link_cmd down "${2:?cut HOST}" ;;
  restore) link_cmd up "${2:?restore HOST}" ;;
  check) check ;;
  *) die "usage: test_hosts.sh run N [--rate RATE] [--slots S] -- CMD... | cut HOST | restore HOST | check" ;;
esac
