#!/usr/bin/env bash
# Slurm on the emulated cluster (scripts/cluster.sh): Debian's slurm-wlm, a controller on node0
# and one slurmd per node, each inside its node's namespaces, so that srun and sbatch place
# tasks on nodes that Open MPI and tutti see as distinct hosts (docs/multinode.md, "Slurm").
#
#   scripts/cluster-slurm.sh install                  # apt: slurm-wlm (not in scripts/setup.sh)
#   scripts/cluster-slurm.sh up   [--name N]          # on a cluster that is up: start Slurm
#   scripts/cluster-slurm.sh exec [--name N] -- CMD   # CMD on node0 with Slurm's client set up
#   scripts/cluster-slurm.sh down [--name N]          # stop Slurm (cluster.sh down also does)
#   scripts/cluster-slurm.sh check [--name N]         # srun/sbatch checks of docs/multinode.md
#
# Nothing is written to /etc/slurm: the configuration, state and logs live in the cluster's
# state directory, and every daemon and client is pointed there (-f, SLURM_CONF). Authentication
# is auth/none and cred/none (Debian ships both plugins): every "node" is this machine, as the
# same user, so munge would add a daemon and prove nothing more. Tasks are tracked by process
# group (proctrack/pgid) and not bound (task/none): there are no cgroups to give each emulated
# node. MPI: PMIx (srun --mpi=pmix), the interface that both Debian's Slurm (mpi_pmix) and
# Debian's Open MPI (pmix ext3x on libpmix2) have; Debian's Open MPI has no PMI2 client (no s2
# component), so --mpi=pmi2 cannot start an Open MPI program here.
set -euo pipefail

SELF=$(readlink -f "$0")
CLUSTER=$(dirname "$SELF")/cluster.sh
STATE_ROOT=${TUTTI_CLUSTER_STATE:-/run/tutti-cluster}
name=tc

die() { echo "cluster-slurm.sh: $*" >&2; exit 1; }

verb=${1:-help}
[ $# -gt 0 ] && shift
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --) shift; break ;;
    *) [ "$verb" = check ] && break; die "unknown argument '$1'" ;;
  esac
done
dir=$STATE_ROOT/$name
sdir=$dir/slurm

on() {  # NODE CMD...: on a node, with Slurm's configuration, without the cluster's mpirun defaults
  local node=$1; shift
  SLURM_CONF=$sdir/slurm.conf bash "$CLUSTER" exec --name "$name" --node "$node" -- \
    env -u OMPI_MCA_orte_default_hostfile -u OMPI_MCA_plm_rsh_agent SLURM_CONF="$sdir/slurm.conf" "$@"
}

install() {
  command -v slurmd >/dev/null && command -v slurmctld >/dev/null && command -v srun >/dev/null && {
    echo "cluster-slurm.sh: slurm-wlm is installed"; return; }
  [ "$(id -u)" -eq 0 ] || die "install needs root"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm
}

up() {
  [ -f "$dir/config" ] || die "no cluster '$name' (scripts/cluster.sh up --name $name first)"
  command -v slurmd >/dev/null || die "Slurm is not installed (scripts/cluster-slurm.sh install)"
  # shellcheck disable=SC1091  # written by cluster.sh up: sets nodes, slots, ...
  . "$dir/config"
  : "${nodes:?$dir/config does not set nodes}"
  mkdir -p "$sdir/ctld" "$sdir/log"
  local last=$((nodes - 1)) cpus
  cpus=$(nproc)
  cat > "$sdir/slurm.conf" <<EOF
# Written by scripts/cluster-slurm.sh for the emulated cluster '$name' ($nodes node(s)).
ClusterName=tutti$name
SlurmctldHost=node0(10.77.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=pmix
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$sdir/ctld
SlurmdSpoolDir=$sdir/spool-%n
SlurmctldPidFile=$sdir/slurmctld.pid
SlurmdPidFile=$sdir/slurmd-%n.pid
SlurmctldLogFile=$sdir/log/slurmctld.log
SlurmdLogFile=$sdir/log/slurmd-%n.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
# The emulated nodes share this machine's $cpus core(s): each claims them all.
NodeName=node[0-$last] NodeAddr=10.77.0.[1-$nodes] CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=emu Nodes=node[0-$last] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  : > "$sdir/cgroup.conf"
  on node0 slurmctld -f "$sdir/slurm.conf" -i
  for ((i = 0; i < nodes; i++)); do
    mkdir -p "$sdir/spool-node$i"
    on "node$i" slurmd -f "$sdir/slurm.conf" -N "node$i"
  done
  # Wait until every node is idle.
  for _ in $(seq 100); do
    local idle
    idle=$(on node0 sinfo -h -t idle -o '%D' 2>/dev/null | awk '{s+=$1} END {print s+0}')
    [ "$idle" = "$nodes" ] && { echo "cluster-slurm.sh: Slurm is up on '$name': $nodes node(s) idle"; return; }
    sleep 0.2
  done
  on node0 sinfo -N -l >&2 || true
  die "the nodes did not become idle (logs in $sdir/log)"
}

down() {
  [ -d "$sdir" ] || return 0
  for f in "$sdir"/slurmd-*.pid "$sdir"/slurmctld.pid; do
    if [ -f "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
  done
  sleep 0.5
  echo "cluster-slurm.sh: Slurm on '$name' stopped"
}

case "$verb" in
  install) install ;;
  up) up ;;
  down) down ;;
  exec) [ $# -gt 0 ] || die "exec: no command"; on node0 "$@" ;;
  check) exec python3 "$(dirname "$SELF")/../tests/cluster/slurm_check.py" --name "$name" "$@" ;;
  *) sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//' ;;
esac
