#!/usr/bin/env bash
# AllReduce and DDP scaling across emulated nodes (scripts/cluster.sh): 1, 2 and 4 nodes, at
# several link bandwidths, Open MPI's allreduce algorithms side by side. Writes JSON and text
# into build/bench/cluster/, or OUT (OUT=docs/bench/cluster refreshes the data behind
# docs/multinode.md), then the plots and the model fit.
# Needs root, a build (scripts/build.sh) and ~25 minutes on 2 cores.
#   bash scripts/cluster-bench.sh                 # everything
#   bash scripts/cluster-bench.sh allreduce       # one part: allreduce, algorithms, ddp
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${BUILD:-build}
out=${OUT:-build/bench/cluster}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
speeds=${SPEEDS:-"1gbit 2.5gbit 10gbit"}
parts=${*:-allreduce algorithms ddp}
name=bench$$
cluster() { bash scripts/cluster.sh "$@"; }
trap 'cluster down --name $name >/dev/null 2>&1' EXIT
# "NxK" -> mpirun's --host list: K ranks on each of nodes 0..N-1.
hosts() { local n=${1%x*} k=${1#*x} h="" i; for ((i = 0; i < n; i++)); do h="$h${h:+,}node$i:$k"; done; echo "$h"; }
on() { cluster exec --name $name -- "$@"; }
echo "# measured on: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -r), $(date -u +%F)" > "$out/machine.txt"

allreduce() {  # speed layout algorithm [extra flags]
  local speed=$1 layout=$2 alg=$3; shift 3
  local f="$out/allreduce_${speed}_${layout}_${alg}"
  on mpirun --host "$(hosts "$layout")" "$build/benchmarks/comm/allreduce_bench" --mpi-allreduce "$alg" \
    --json "$f.json" "$@" > "$f.txt" 2>&1 || echo "FAILED: $f (see $f.txt)"
  tail -n +1 "$f.txt" | grep -vE '^(tutti|  MPI|  rank)' | sed "s|^|$speed $layout $alg: |" | tail -4
}

for speed in $speeds; do
  cluster down --name $name >/dev/null 2>&1
  cluster up --name $name --nodes 4 --slots 2 --bandwidth "$speed" >/dev/null || exit 1
  layouts="2x1 2x2 4x1 4x2"
  # The links do not matter within a node: the 1-node layouts once, on the first speed's cluster.
  [ "$speed" = "${speeds%% *}" ] && layouts="1x2 1x4 $layouts"
  for part in $parts; do
    for layout in $layouts; do
      sp=$speed; [ "${layout%x*}" = 1 ] && sp=local
      case $part in
        allreduce) allreduce "$sp" "$layout" default -b 8 -e 8M -f 4 --iters 20 ;;
        algorithms)
          for alg in ring recursive_doubling rabenseifner han; do
            allreduce "$sp" "$layout" "$alg" -b 2K -e 8M -f 4 --iters 10 --warmup 3 --no-raw
          done ;;
        ddp)
          case $speed in 1gbit|10gbit) ;; *) continue ;; esac
          f="$out/ddp_${sp}_${layout}"
          on mpirun --host "$(hosts "$layout")" "$build/benchmarks/ddp/ddp_bench" --hidden 1024 --layers 3 \
            --batch 128 --bucket-mb 4 --steps 10 --json "$f.json" > "$f.txt" 2>&1 || echo "FAILED: $f"
          tail -4 "$f.txt" | sed "s|^|ddp $sp $layout: |" ;;
      esac
    done
  done
done
cluster down --name $name >/dev/null
/usr/bin/python3 benchmarks/scaling/plots.py "$out" || echo "cluster-bench.sh: plots skipped (python3-matplotlib)"
