#!/usr/bin/env bash
# An emulated cluster on one machine: K "nodes" made of Linux namespaces, for multi-node tests
# and benchmarks (docs/multinode.md, "The emulated cluster").
#
#   scripts/cluster.sh up   [--name N] [--nodes K] [--slots S] [--bandwidth RATE] [--latency-us L]
#                           [--tcp-retries2 R]
#   scripts/cluster.sh run  [up's options] [--keep] -- COMMAND...   # up, COMMAND on node0, down
#   scripts/cluster.sh exec [--name N] [--node nodeI] -- COMMAND...  # COMMAND on one node
#   scripts/cluster.sh link [--name N] --node nodeI (down|up|--bandwidth RATE)
#   scripts/cluster.sh down [--name N]                               # also: down --all
#   scripts/cluster.sh status | check
#
# Each node is a network namespace (its own interface eth0 and address), a UTS namespace (its
# own hostname: node0, node1, ...) and a mount namespace (its own /dev/shm and /tmp, so that
# shared memory and scratch files are per node as on real machines; its own /etc/hosts naming
# the nodes; /sys showing its own network, and the host's cgroups). Everything else (the file
# system, processes) is shared with the host, like a cluster's shared file system: write what
# should outlive a node or be seen by another one under the working tree, not /tmp (a checkout,
# the working folder of `up`, and the folders in TUTTI_CLUSTER_KEEP=a:b that lie under /tmp are
# carried into every node's /tmp at the same path). The nodes'
# eth0 are veth pairs into a bridge that lives in a namespace of its own (the "switch"), so no
# address or interface is ever made in the host's own network namespace. Each port is shaped
# in both directions with tc (HTB: --bandwidth per direction, like a NIC port), and, where the
# kernel has netem, delayed by --latency-us.
#
# A node that drops off the network (link down: every packet lost, no connection reset) is
# noticed by TCP only when its retransmissions give up: net.ipv4.tcp_retries2, set in each node
# to --tcp-retries2 (default 3: ~6 s at the minimum retransmission timeout; the kernel's 15 is
# ~15 minutes, for which mpirun then waits for its daemon on the lost node).
#
# Commands on node0 get an environment in which a plain `mpirun -np 4 prog` spreads its ranks
# over the nodes: OMPI_MCA_orte_default_hostfile (the cluster's hostfile: "nodeI slots=S") and
# OMPI_MCA_plm_rsh_agent (a script that enters node I's namespaces where Open MPI would ssh).
# Open MPI then sees K distinct hosts: TCP between them, shared memory within each.
#
# `run` removes the cluster when COMMAND ends, also when it fails or is interrupted; `up` removes
# what it made when it fails half-way; `down` kills every process left in the nodes first. Where
# namespaces cannot be made (not root, no iproute2, a container without CAP_SYS_ADMIN), `check`,
# `up` and `run` refuse with the reason and exit code 77 (ctest's "skipped").
set -euo pipefail

SELF=$(readlink -f "$0")
STATE_ROOT=${TUTTI_CLUSTER_STATE:-/run/tutti-cluster}
SUBNET=10.77.0   # only inside the cluster's own namespaces
SKIP=77

name=tc
nodes=2
slots=2
bandwidth=""
latency_us=""
tcp_retries2=3
node=node0
keep=0
all=0

die() { echo "cluster.sh: $*" >&2; exit 1; }
refuse() { echo "cluster.sh: cannot make an emulated cluster here: $*" >&2; exit $SKIP; }

usage() { sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'; }

ns_node() { echo "tutti-$name-node$1"; }
ns_switch() { echo "tutti-$name-sw"; }
state() { echo "$STATE_ROOT/$name"; }

# ---- can namespaces be made here? ------------------------------------------------------------
check() {
  [ "$(id -u)" -eq 0 ] || refuse "needs root (network namespaces, veth, tc); running as uid $(id -u)"
  for tool in ip tc nsenter unshare mount; do
    command -v "$tool" >/dev/null 2>&1 || refuse "'$tool' is missing (Debian: iproute2, util-linux, mount)"
  done
  local probe="tutti-probe-$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then
    refuse "'ip netns add' failed: $err"
  fi
  if ! err=$(unshare --uts --mount true 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    refuse "'unshare --uts --mount' failed: $err"
  fi
  if ! err=$(ip -n "$probe" link add tp0 type veth peer name tp1 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    refuse "no veth pairs: $err"
  fi
  if ! err=$(ip -n "$probe" link add tb0 type bridge 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    refuse "no bridges: $err"
  fi
  if [ -n "$bandwidth" ] && ! err=$(tc -n "$probe" qdisc add dev tp0 root handle 1: htb 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    refuse "no HTB qdisc for --bandwidth: $err"
  fi
  if [ -n "$latency_us" ] && [ "$latency_us" != 0 ] && ! err=$(tc -n "$probe" qdisc replace dev tp1 root netem delay 1us 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    refuse "--latency-us needs the netem qdisc, which this kernel lacks ($err; CONFIG_NET_SCH_NETEM); leave it out to use the links' own latency"
  fi
  ip netns del "$probe"
}

# ---- links -----------------------------------------------------------------------------------
# shape NS DEV: HTB at $bandwidth (per direction) and, with latency, netem below it.
shape() {
  local ns=$1 dev=$2
  tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
  [ -n "$bandwidth" ] || [ -n "$latency_us" ] || return 0
  if [ -n "$bandwidth" ]; then
    local bps burst
    bps=$(rate_bits "$bandwidth")
    # A burst of 1 ms at the rate (at least one 64 KiB GSO packet): smaller bursts make HTB's
    # timer the limit above a few Gbit/s; larger ones let short messages pass unshaped.
    burst=$(( bps / 8 / 1000 ))
    [ "$burst" -ge 65536 ] || burst=65536
    tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 1
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:1 htb rate "$bps" ceil "$bps" burst "$burst" cburst "$burst" quantum 65536
    if [ -n "$latency_us" ] && [ "$latency_us" != 0 ]; then
      tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem delay "${latency_us}us" limit 100000
    fi
  elif [ "$latency_us" != 0 ]; then
    tc -n "$ns" qdisc add dev "$dev" root netem delay "${latency_us}us" limit 100000
  fi
}

# "10gbit", "2.5gbit", "100mbit", "1e9" -> bits per second
rate_bits() {
  python3 - "$1" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9.e+]+)\s*([kmgt]?)(bit|bps|b)?", sys.argv[1].strip().lower())
if not m:
    sys.exit("cluster.sh: bad rate '%s' (e.g. 1gbit, 2.5gbit, 100mbit)" % sys.argv[1])
mult = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
if m.group(3) == "bps":
    mult *= 8
print(int(float(m.group(1)) * mult))
EOF
}

# ---- up / down -------------------------------------------------------------------------------
up() {
  check
  local dir; dir=$(state)
  [ ! -e "$dir" ] || die "a cluster named '$name' exists already ($dir): 'cluster.sh down --name $name' first"
  if ! [[ "$nodes" =~ ^[0-9]+$ ]] || [ "$nodes" -lt 1 ] || [ "$nodes" -gt 64 ]; then die "--nodes must be 1..64"; fi
  if ! [[ "$slots" =~ ^[0-9]+$ ]] || [ "$slots" -lt 1 ]; then die "--slots must be a positive number"; fi
  trap 'echo "cluster.sh: up failed; removing what it made" >&2; down_quiet' ERR
  mkdir -p "$dir"
  cat > "$dir/config" <<EOF
nodes=$nodes
slots=$slots
bandwidth=$bandwidth
latency_us=$latency_us
tcp_retries2=$tcp_retries2
EOF
  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < nodes; i++)); do echo "$SUBNET.$((i + 1)) node$i"; done
  } > "$dir/hosts"
  : > "$dir/hostfile"
  for ((i = 0; i < nodes; i++)); do echo "node$i slots=$slots" >> "$dir/hostfile"; done
  # Open MPI's remote-launch agent: "agent [options] HOST COMMAND..." as ssh would be called.
  cat > "$dir/agent" <<EOF
#!/bin/sh
# Open MPI's plm_rsh_agent for the emulated cluster '$name': runs the command inside the node's
# namespaces where ssh would run it on a remote host.
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
exec "$SELF" exec --name "$name" --node "\$host" -- /bin/sh -c "\$*"
EOF
  chmod +x "$dir/agent"

  # Folders under /tmp that every node must still see: this checkout, the caller's working
  # folder, and TUTTI_CLUSTER_KEEP (colon-separated: a build tree outside the checkout, say); a
  # folder inside another one of them is carried with it, not on its own.
  local candidates=() carried=() p
  for p in "$(dirname "$(dirname "$SELF")")" "$PWD" ${TUTTI_CLUSTER_KEEP:+${TUTTI_CLUSTER_KEEP//:/ }}; do
    p=$(readlink -f "$p" 2>/dev/null || true)
    case "$p" in /tmp/?*) [ -d "$p" ] && candidates+=("$p") ;; esac
  done
  for p in "${candidates[@]}"; do
    local inside=0 c
    for c in "${candidates[@]}" "${carried[@]}"; do
      [ "$c" != "$p" ] && case "$p/" in "$c"/*) inside=1 ;; esac
    done
    for c in "${carried[@]}"; do [ "$c" = "$p" ] && inside=1; done
    [ "$inside" = 0 ] && carried+=("$p")
  done
  local sw; sw=$(ns_switch)
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < nodes; i++)); do
    local ns; ns=$(ns_node "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # The pair is made inside the switch namespace; one end moves into the node as eth0.
    ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2="$tcp_retries2"
    shape "$ns" eth0
    shape "$sw" "p$i"
    # The node's hostname, /dev/shm, /tmp, /etc/hosts and /sys: new UTS and mount namespaces,
    # kept alive by a holder process that every later command enters (through /proc/PID/ns,
    # which every node sees). Detached, and with no terminal or pipe of the caller's held open.
    # The node's own /tmp would hide a checkout or build there (a CI clone in /tmp): those
    # folders are carried into it (bound aside first, then moved onto the same path).
    local carry_out="" carry_in=""
    for ((k = 0; k < ${#carried[@]}; k++)); do
      carry_out+="mkdir -p '$dir/carry-node$i-$k'; mount --rbind '${carried[$k]}' '$dir/carry-node$i-$k';"
      carry_in+="mkdir -p '${carried[$k]}'; mount --move '$dir/carry-node$i-$k' '${carried[$k]}';"
    done
    setsid nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation slave /bin/sh -c "
        set -e
        hostname node$i
        mount -t tmpfs -o size=4g,mode=1777 tmpfs-node$i /dev/shm
        $carry_out
        mount -t tmpfs -o size=4g,mode=1777 tmp-node$i /tmp
        $carry_in
        mount --bind '$dir/hosts' /etc/hosts
        mkdir -p '$dir/cgroup-node$i'
        mount --rbind /sys/fs/cgroup '$dir/cgroup-node$i'
        mount -t sysfs sysfs-node$i /sys
        mount --move '$dir/cgroup-node$i' /sys/fs/cgroup
        echo \$\$ > '$dir/node$i.pid.tmp'
        mv '$dir/node$i.pid.tmp' '$dir/node$i.pid'
        exec sleep infinity" </dev/null >/dev/null 2>&1 &
  done
  for ((i = 0; i < nodes; i++)); do
    for _ in $(seq 100); do [ -s "$dir/node$i.pid" ] && break; sleep 0.02; done
    [ -s "$dir/node$i.pid" ] || { echo "cluster.sh: node$i did not come up" >&2; false; }
  done
  trap - ERR
  echo "cluster.sh: '$name' is up: $nodes node(s) x $slots slot(s)${bandwidth:+, $bandwidth per link direction}${latency_us:+, +${latency_us} us}; hostfile $dir/hostfile"
}

# Kills what runs in the nodes, removes the namespaces, mounts and files of cluster $name.
down_quiet() {
  local dir; dir=$(state)
  local nsl
  nsl=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^tutti-$name-(node[0-9]+|sw)$" || true)
  local pids=""
  for ns in $nsl; do pids="$pids $(ip netns pids "$ns" 2>/dev/null || true)"; done
  if [ -n "${pids// /}" ]; then
    # shellcheck disable=SC2086  # a list of pids
    kill -TERM $pids 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      local alive=""
      for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
      [ -z "$alive" ] && break
      sleep 0.1
    done
    # shellcheck disable=SC2086  # a list of pids
    kill -KILL $pids 2>/dev/null || true
  fi
  for ns in $nsl; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$dir"
}

down() {
  if [ "$all" = 1 ]; then
    local names
    names=$( { ls "$STATE_ROOT" 2>/dev/null; ip netns list 2>/dev/null | awk '{print $1}' | sed -n 's/^tutti-\(.*\)-\(node[0-9]*\|sw\)$/\1/p'; } | sort -u)
    for n in $names; do name=$n; down_quiet; done
    echo "cluster.sh: removed ${names:-nothing}"
    return
  fi
  down_quiet
  echo "cluster.sh: '$name' is down"
}

# ---- running things in nodes -----------------------------------------------------------------
node_env() {
  local dir; dir=$(state)
  export TUTTI_CLUSTER_NAME=$name TUTTI_CLUSTER_HOSTFILE="$dir/hostfile" TUTTI_CLUSTER_STATE_DIR="$dir"
  export OMPI_MCA_orte_default_hostfile="$dir/hostfile" OMPI_MCA_plm_rsh_agent="$dir/agent"
  # The nodes' only interface besides lo: TCP between nodes goes there.
  export OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0
}

exec_on() {
  local dir; dir=$(state)
  [ -d "$dir" ] || die "no cluster named '$name' (cluster.sh up --name $name)"
  local i=${node#node}
  if ! [[ "$i" =~ ^[0-9]+$ ]] || ! [ -s "$dir/node$i.pid" ]; then die "cluster '$name' has no node '$node'"; fi
  local holder; holder=$(cat "$dir/node$i.pid")
  kill -0 "$holder" 2>/dev/null || die "node '$node' of cluster '$name' is gone (its holder process $holder ended)"
  node_env
  exec nsenter --target "$holder" --net --uts --mount --wd="$PWD" -- "$@"
}

link() {
  local dir; dir=$(state)
  [ -d "$dir" ] || die "no cluster named '$name'"
  local i=${node#node} sw; sw=$(ns_switch)
  case "$1" in
    down) ip -n "$sw" link set "p$i" down ;;  # the cable pulled: every packet to/from the node is lost
    up) ip -n "$sw" link set "p$i" up ;;
    shape) shape "$(ns_node "$i")" eth0; shape "$sw" "p$i" ;;
  esac
}

status() {
  [ -d "$STATE_ROOT" ] && find "$STATE_ROOT" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort | while read -r n; do
    echo "cluster '$n': $(tr '\n' ' ' < "$STATE_ROOT/$n/config")"
  done
  ip netns list | grep -E '^tutti-' || echo "(no tutti namespaces)"
}

# ---- command line ----------------------------------------------------------------------------
verb=${1:-help}
[ $# -gt 0 ] && shift
link_action=""
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --bandwidth) bandwidth=$2; link_action=shape; shift 2 ;;
    --latency-us) latency_us=$2; shift 2 ;;
    --tcp-retries2) tcp_retries2=$2; shift 2 ;;
    --node) node=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --all) all=1; shift ;;
    down|up) link_action=$1; shift ;;
    --) shift; break ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (cluster.sh --help)" ;;
  esac
done
[[ "$name" =~ ^[A-Za-z0-9_]{1,16}$ ]] || die "--name must be 1-16 letters, digits or _"

case "$verb" in
  check) check; echo "cluster.sh: namespaces can be made here" ;;
  up) up ;;
  down) down ;;
  status) status ;;
  exec) [ $# -gt 0 ] || die "exec: no command (cluster.sh exec --node node1 -- hostname)"; exec_on "$@" ;;
  link) [ -n "$link_action" ] || die "link: down, up or --bandwidth RATE"; link "$link_action" ;;
  run)
    [ $# -gt 0 ] || die "run: no command (cluster.sh run --nodes 2 -- mpirun -np 4 hostname)"
    up
    if [ "$keep" = 0 ]; then trap 'down_quiet' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; fi
    # In the background, so that a signal to this script runs the trap (down) at once.
    set +e
    ( node=node0; exec_on "$@" ) <&0 &
    child=$!
    wait $child
    rc=$?
    exit $rc ;;
  help|-h|--help) usage ;;
  *) die "unknown verb '$verb' (up, down, run, exec, link, status, check)" ;;
esac
