#!/usr/bin/env bash
# Issue 15 item 6, offline: DDP with the bucket cap that benchmarks/scaling/predict --plan-buckets
# picks (4 MiB: each layer of ddp_bench's MLP its own bucket) against the 25 MiB default, on 2 and
# 4 emulated nodes at 1 and 2.5 Gbit/s; three alternating repeats. Writes build/bench/cluster/buckets/,
# or OUT (OUT=docs/bench/cluster/buckets refreshes the data in docs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${BUILD:-build}
out=${OUT:-build/bench/cluster/buckets}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
name=bkt$$
trap 'bash scripts/cluster.sh down --name $name >/dev/null 2>&1' EXIT
for speed in 1gbit 2.5gbit; do
  bash scripts/cluster.sh down --name $name >/dev/null 2>&1
  bash scripts/cluster.sh up --name $name --nodes 4 --slots 1 --bandwidth $speed >/dev/null || exit 1
  for hosts in node0,node1 node0,node1,node2,node3; do
    n=$(echo $hosts | tr ',' '\n' | wc -l)
    for rep in 1 2 3; do
      for cap in 25 4; do
        f="$out/ddp_${speed}_${n}x1_cap${cap}_run$rep"
        bash scripts/cluster.sh exec --name $name -- mpirun --host $hosts "$build/benchmarks/ddp/ddp_bench" --hidden 1024 \
          --layers 3 --batch 128 --bucket-mb $cap --steps 10 --json "$f.json" > "$f.txt" 2>&1 || echo "FAILED $f"
        echo "$speed ${n}x1 cap $cap run $rep: $(grep -E '^overlap ' "$f.txt")"
      done
    done
  done
done
