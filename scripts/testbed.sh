#!/usr/bin/env bash
# scripts/testbed.sh — hosts on one machine for runs across real links: each host a network namespace with its own
# address in 198.18.0.0/15 (reserved for benchmarking), attached by a veth pair to a bridge in a namespace of its
# own, its link shaped in both directions with `tc tbf`. No route leads out: traffic goes only between the
# testbed's hosts. Needs root (ip netns, veth, tc).
#
#   scripts/testbed.sh up [--hosts N] [--rate RATE] [--burst BYTES] [--limit BYTES] [--delay MS] [--tcp CC]
#   scripts/testbed.sh shape HOST RATE [egress]  # change one host's link while a run goes on ("none": unshaped);
#                                             # egress: only what the host sends (an uplink-bound host)
#   scripts/testbed.sh link HOST up|down      # take a host's link down (a partition) or bring it back
#   scripts/testbed.sh exec HOST COMMAND...   # run COMMAND inside host HOST (0 .. N-1)
#   scripts/testbed.sh addr HOST              # the host's address
#   scripts/testbed.sh counters HOST          # bytes sent and received on the host's link (its interface's own counters)
#   scripts/testbed.sh status                 # hosts, addresses, shaping, whether delay (netem) can be emulated
#   scripts/testbed.sh down                   # remove everything `up` made
#   scripts/testbed.sh check                  # exit 0 when this machine can make a testbed (root, namespaces, tbf)
#
# RATE is tc's syntax: 10mbit, 1mbit, 1gbit, ... or "none". Defaults: 3 hosts, unshaped; burst 32 KiB and a queue
# of 256 KiB (queue limit per direction; at low rates a full queue adds delay, as on a real slow link).
# TESTBED_NAME (default "dlt") prefixes every namespace and names the state file /run/<name>.testbed (hosts=N,
# addr<i>=ADDRESS, rate<i>=RATE, script=PATH of this script: what `deloco run --set testbed.name=<name>` reads), so two testbeds can coexist (the machine reaches the hosts of the first one up). The machine's
# own namespace joins the bridge at 198.18.255.254/16 (interface <name>-root, unshaped), so a dashboard on a host can
# be opened here; `up` refuses (naming it, nothing made) while any route or address of this machine other than a
# testbed's own port lies in 198.18.0.0/15. `up` on a failure removes what it made; `down` is safe to repeat.
# Delay: netem is absent from some kernels (`status` says whether it is here), so `--delay MS` puts a delay line of
# our own on every host's link instead (tools/delayline.cpp, build/deloco-delayline or $DELOCO_DELAYLINE): a
# process in the bridge's namespace that holds each frame MS milliseconds in each direction of each host's link
# (bounded: at most 16 MiB waiting per direction; a frame that finds it full is dropped and counted). A frame
# crosses two host links between two hosts: their round trip gains 4 × MS (--delay 12.5: 50 ms). Loss needs netem.
# --tcp CC: the TCP congestion control of every host (net.ipv4.tcp_congestion_control in its namespace: cubic,
# bbr, ... as this kernel lists them); without it the kernel's default (cubic).
set -Eeuo pipefail

NAME=${TESTBED_NAME:-dlt}
STATE=/run/${NAME}.testbed
BR_NS=${NAME}-br
ROOT_DEV=${NAME}-root
ROOT_ADDR=198.18.255.254
SUBNET=198.18.0
MAX_HOSTS=200
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"

die() { echo "testbed: $*" >&2; exit 1; }
[[ "$NAME" =~ ^[a-z][a-z0-9]{0,9}$ ]] || die "TESTBED_NAME must be 1-10 lower-case letters and digits, a letter first (got '$NAME')"
need_root() { [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veth pairs and tc); nothing was made"; }
host_ns() { echo "${NAME}-h$1"; }
host_addr() { echo "${SUBNET}.$(( $1 + 1 ))"; }
hosts() { [ -f "$STATE" ] || die "no testbed '$NAME' is up (scripts/testbed.sh up)"; sed -n 's/^hosts=//p' "$STATE"; }
check_host() {
  local n; n=$(hosts)
  [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -lt "$n" ] || die "no host '$1' (hosts are 0 .. $((n - 1)))"
}
valid_rate() { [ "$1" = none ] || [[ "$1" =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]]; }

# Whether the IPv4 prefix $1 ("A.B.C.D" or "A.B.C.D/LEN") overlaps 198.18.0.0/15 (198.18.0.0 .. 198.19.255.255).
in_bench_range() {
  local net=${1%/*} len=32 a b c d
  [[ $1 == */* ]] && len=${1#*/}
  IFS=. read -r a b c d <<<"$net"
  [[ "$a.$b.$c.$d/$len" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+/[0-9]+$ ]] && [ "$len" -le 32 ] || return 1
  local lo=$(( ((10#$a << 24) | (10#$b << 16) | (10#$c << 8) | 10#$d) & ((0xffffffff << (32 - 10#$len)) & 0xffffffff) ))
  local hi=$(( lo + (1 << (32 - 10#$len)) - 1 ))
  [ "$lo" -le $(( 0xc613ffff )) ] && [ "$hi" -ge $(( 0xc6120000 )) ]
}

# The routes (every table) and addresses of this machine's own namespace that touch 198.18.0.0/15, one a line as
# `ip` prints them, except those on the port of a testbed of this script that is up (<name>-root with its
# /run/<name>.testbed): two testbeds may coexist. The default route covers everything and is not counted.
foreign_bench_routes() {
  local routes addrs line words dest dev i
  routes=$(ip -4 route show table all) || die "cannot list this machine's routes (ip -4 route show table all)"
  addrs=$(ip -4 -o addr show) || die "cannot list this machine's addresses (ip -4 -o addr show)"
  while read -r line; do
    [ -n "$line" ] || continue
    read -r -a words <<<"$line"
    i=0
    case "${words[0]}" in
      unicast | local | broadcast | multicast | anycast | blackhole | unreachable | prohibit | throw | nat) i=1 ;;
    esac
    dest=${words[i]:-}
    [ "$dest" = default ] && continue
    in_bench_range "$dest" || continue
    dev=""
    [[ " $line " =~ \ dev\ ([^ ]+)\  ]] && dev=${BASH_REMATCH[1]}
    if [[ "$dev" =~ ^([a-z][a-z0-9]{0,9})-root$ ]] && [ -f "/run/${BASH_REMATCH[1]}.testbed" ]; then continue; fi
    echo "route '$line'"
  done <<<"$routes"
  while read -r i dev words dest _; do   # "3: eth0    inet 198.19.200.1/24 ..."
    [ "$words" = inet ] && in_bench_range "${dest%/*}" || continue
    if [[ "$dev" =~ ^([a-z][a-z0-9]{0,9})-root$ ]] && [ -f "/run/${BASH_REMATCH[1]}.testbed" ]; then continue; fi
    echo "address $dest on $dev"
  done <<<"$addrs"
  return 0
}

# Shapes one direction: the egress of `dev` in namespace `ns`.
shape_dev() {
  local ns=$1 dev=$2 rate=$3 burst=$4 limit=$5
  ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
  [ "$rate" = none ] && return 0
  ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" limit "$limit"
}
shape_host() {
  local h=$1 rate=$2 dir=${3:-both} burst limit
  burst=$(sed -n 's/^burst=//p' "$STATE"); limit=$(sed -n 's/^limit=//p' "$STATE")
  shape_dev "$(host_ns "$h")" eth0 "$rate" "$burst" "$limit"   # host -> bridge
  if [ "$dir" = egress ]; then shape_dev "$BR_NS" "h$h" none "$burst" "$limit"
  else shape_dev "$BR_NS" "h$h" "$rate" "$burst" "$limit"; fi   # bridge -> host
  sed -i "/^rate$h=/d" "$STATE"
  echo "rate$h=$rate" >> "$STATE"
}

netem_available() {
  local ns=${NAME}-probe$$ ok=no
  ip netns add "$ns" 2>/dev/null || return 1
  ip netns exec "$ns" ip link set lo up
  if ip netns exec "$ns" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then ok=yes; fi
  ip netns del "$ns"
  [ "$ok" = yes ]
}

cmd_check() {
  [ "$(id -u)" = 0 ] || { echo "testbed: not root"; return 1; }
  command -v ip >/dev/null && command -v tc >/dev/null || { echo "testbed: ip or tc missing (iproute2)"; return 1; }
  local ns=${NAME}-probe$$
  if ! { ip netns add "$ns" && ip netns exec "$ns" ip link set lo up &&
         ip netns exec "$ns" tc qdisc add dev lo root tbf rate 1mbit burst 32kb limit 64kb; } 2>/dev/null; then
    ip netns del "$ns" 2>/dev/null || true
    echo "testbed: this machine cannot make network namespaces with tbf qdiscs"; return 1
  fi
  ip netns del "$ns"
  echo "testbed: this machine can make a testbed"
}

cmd_down() {
  need_root
  local made=0 pid
  # The delay line first (it lives in the bridge's namespace and would keep it): its counters go to the output.
  pid=$(sed -n 's/^delayline_pid=//p' "$STATE" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    echo "delay line: $(tail -n 1 "/run/$NAME.delayline.log" 2>/dev/null)"
  fi
  rm -f "/run/$NAME.delayline.log" "/run/$NAME.delayline.ready"
  for ns in $(ip netns list | awk '{print $1}'); do
    case "$ns" in "${NAME}"-h[0-9]* | "${BR_NS}" | "${NAME}"-probe*) ip netns del "$ns" && made=$((made + 1)) ;; esac
  done
  ip link del "$ROOT_DEV" 2>/dev/null || true  # gone with the bridge's namespace already, normally
  rm -f "$STATE"
  echo "testbed '$NAME' down ($made namespaces removed)"
}

cmd_up() {
  need_root
  local n=3 rate=none burst=32kb limit=256kb delay=0 dl="" cc=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) n=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --burst) burst=$2; shift 2 ;;
      --limit) limit=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --tcp) cc=$2; shift 2 ;;
      *) die "unknown option '$1' (up [--hosts N] [--rate RATE] [--burst BYTES] [--limit BYTES] [--delay MS] [--tcp CC])" ;;
    esac
  done
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAX_HOSTS ] || die "--hosts must be 1 .. $MAX_HOSTS (got '$n')"
  valid_rate "$rate" || die "--rate must be like 10mbit, 1gbit or none (got '$rate')"
  [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v d="$delay" 'BEGIN { exit !(d <= 5000) }' ||
    die "--delay must be milliseconds, 0 .. 5000 (got '$delay')"
  if [ "$delay" != 0 ] && awk -v d="$delay" 'BEGIN { exit !(d > 0) }'; then
    dl=${DELOCO_DELAYLINE:-$(dirname "$SELF")/../build/deloco-delayline}
    [ -x "$dl" ] || die "--delay needs the delay line program: $dl is not there (cmake --build build --target deloco-delayline, or set DELOCO_DELAYLINE)"
  fi
  if [ -n "$cc" ]; then
    grep -qwF -- "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control ||
      die "--tcp must be a congestion control this kernel has: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control) (got '$cc')"
  fi
  [ -f "$STATE" ] && die "testbed '$NAME' is already up (scripts/testbed.sh down first, or set TESTBED_NAME)"
  ip netns list | awk '{print $1}' | grep -qx "$BR_NS" && die "namespace $BR_NS exists but no state file: scripts/testbed.sh down"
  # This machine gets $ROOT_ADDR/16, a route to 198.18.0.0/16: refused while anything else here uses 198.18.0.0/15
  # (a real network there would be shadowed, or would shadow the testbed).
  local foreign; foreign=$(foreign_bench_routes)
  [ -z "$foreign" ] || die "198.18.0.0/15 is already in use on this machine, and the testbed would take 198.18.0.0/16:
$(sed 's/^/  /' <<<"$foreign")
nothing was made; remove those (or run the testbed on another machine)"
  # Anything that fails from here removes what was made.
  trap 'echo "testbed: up failed; removing what was made" >&2; cmd_down >/dev/null 2>&1 || true' ERR
  printf 'hosts=%s\nburst=%s\nlimit=%s\nscript=%s\n' "$n" "$burst" "$limit" "$SELF" > "$STATE"
  ip netns add "$BR_NS"
  ip netns exec "$BR_NS" ip link set lo up
  ip netns exec "$BR_NS" ip link add br0 type bridge
  ip netns exec "$BR_NS" ip link set br0 up
  # The machine's own namespace on the bridge too (unshaped, at $ROOT_ADDR), so a dashboard served on a host is
  # reachable from a browser here. It gets no route beyond the testbed's /16, nor do the hosts.
  ip link add "$ROOT_DEV" type veth peer name root netns "$BR_NS"
  ip addr add "$ROOT_ADDR/16" dev "$ROOT_DEV"
  ip link set "$ROOT_DEV" up
  ip netns exec "$BR_NS" ip link set root master br0
  ip netns exec "$BR_NS" ip link set root up
  for ((h = 0; h < n; h++)); do
    local ns; ns=$(host_ns "$h")
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    # Each namespace has its own TCP settings: --tcp sets the congestion control its new connections use.
    [ -z "$cc" ] || ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$cc"
    # The pair is made inside the host's namespace, then one end moved to the bridge's: nothing touches the
    # machine's own namespace.
    if [ -z "$dl" ]; then
      ip netns exec "$ns" ip link add eth0 type veth peer name "h$h"
      ip netns exec "$ns" ip link set "h$h" netns "$BR_NS"
    else  # the host's end meets d$h; the delay line forwards d$h <-> x$h; x$h's pair h$h joins the bridge
      ip netns exec "$ns" ip link add eth0 type veth peer name "d$h"
      ip netns exec "$ns" ip link set "d$h" netns "$BR_NS"
      ip netns exec "$BR_NS" ip link add "x$h" type veth peer name "h$h"
      ip netns exec "$BR_NS" ip link set "d$h" up
      ip netns exec "$BR_NS" ip link set "x$h" up
    fi
    ip netns exec "$ns" ip addr add "$(host_addr "$h")/16" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$BR_NS" ip link set "h$h" master br0
    ip netns exec "$BR_NS" ip link set "h$h" up
    echo "addr$h=$(host_addr "$h")" >> "$STATE"
    shape_host "$h" "$rate"
  done
  if [ -n "$dl" ]; then
    local pairs=() ready="/run/$NAME.delayline.ready"
    for ((h = 0; h < n; h++)); do pairs+=(--pair "d$h:x$h"); done
    rm -f "$ready"
    ip netns exec "$BR_NS" setsid "$dl" "${pairs[@]}" --delay-ms "$delay" --ready "$ready" \
      > "/run/$NAME.delayline.log" 2>&1 < /dev/null &
    local waited=0
    while [ ! -s "$ready" ] && [ $waited -lt 50 ]; do sleep 0.1; waited=$((waited + 1)); done
    [ -s "$ready" ] || { cat "/run/$NAME.delayline.log" >&2; cmd_down >/dev/null 2>&1; die "the delay line did not start"; }
    printf 'delay=%s\ndelayline_pid=%s\n' "$delay" "$(cat "$ready")" >> "$STATE"
    rm -f "$ready"
  fi
  trap - ERR
  [ -z "$cc" ] || echo "tcp=$cc" >> "$STATE"
  echo "testbed '$NAME' up: $n hosts ($(host_addr 0) .. $(host_addr $((n - 1)))), links $rate$([ -z "$cc" ] || echo ", TCP $cc")" \
       "$([ -n "$dl" ] && echo "delayed $delay ms each way on each link (round trip between two hosts +$(awk -v d="$delay" 'BEGIN { print 4 * d }') ms)")"
}

cmd_status() {
  need_root
  local n; n=$(hosts)
  echo "testbed '$NAME': $n hosts, bridge namespace $BR_NS, this machine at $ROOT_ADDR ($ROOT_DEV)"
  for ((h = 0; h < n; h++)); do
    local ns state; ns=$(host_ns "$h")
    state=$(ip netns exec "$ns" cat /sys/class/net/eth0/operstate 2>/dev/null || echo missing)
    echo "  host $h  $ns  $(host_addr "$h")  link $(sed -n "s/^rate$h=//p" "$STATE")  $state"
  done
  local delay; delay=$(sed -n 's/^delay=//p' "$STATE")
  if [ -n "$delay" ]; then
    echo "delay: $delay ms each way on each host's link (delay line pid $(sed -n 's/^delayline_pid=//p' "$STATE"); round trip between two hosts +$(awk -v d="$delay" 'BEGIN { print 4 * d }') ms)"
  fi
  if netem_available; then echo "delay emulation: netem available"
  else echo "delay emulation: no netem in this kernel (up --delay MS adds the testbed's own delay line)"; fi
}

cmd_shape() {
  need_root
  { [ $# -eq 2 ] || { [ $# -eq 3 ] && [ "$3" = egress ]; }; } || die "shape HOST RATE [egress]"
  check_host "$1"
  valid_rate "$2" || die "RATE must be like 10mbit, 1gbit or none (got '$2')"
  shape_host "$1" "$2" "${3:-both}"
  echo "host $1: link $2${3:+ ($3 only)}"
}

cmd_link() {
  need_root
  [ $# -eq 2 ] && { [ "$2" = up ] || [ "$2" = down ]; } || die "link HOST up|down"
  check_host "$1"
  # Both ends, so neither side sees a carrier: a partition as a cut cable looks.
  ip netns exec "$BR_NS" ip link set "h$1" "$2"
  ip netns exec "$(host_ns "$1")" ip link set eth0 "$2"
  echo "host $1: link $2"
}

cmd_exec() {
  need_root
  [ $# -ge 2 ] || die "exec HOST COMMAND..."
  check_host "$1"
  local ns; ns=$(host_ns "$1"); shift
  exec ip netns exec "$ns" "$@"
}

cmd_counters() {
  need_root
  [ $# -eq 1 ] || die "counters HOST"
  check_host "$1"
  local ns; ns=$(host_ns "$1")
  echo "tx_bytes=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes)" \
       "rx_bytes=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes)"
}

verb=${1:-}
[ $# -gt 0 ] && shift
case "$verb" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  check) cmd_check ;;
  status) cmd_status ;;
  shape) cmd_shape "$@" ;;
  link) cmd_link "$@" ;;
  exec) cmd_exec "$@" ;;
  addr) [ $# -eq 1 ] || die "addr HOST"; check_host "$1"; host_addr "$1" ;;
  counters) cmd_counters "$@" ;;
  *) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$verb" ] || [ "$verb" = -h ] || [ "$verb" = --help ] || exit 2 ;;
esac
