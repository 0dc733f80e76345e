#!/usr/bin/env bash
# Runs every CPU benchmark of the project on this machine and writes JSON, text and plots into
# docs/bench/ (the data behind docs/benchmarks.md). Needs a build (scripts/build.sh); the peer
# comparison also needs Debian's python3-torch, the plots python3-matplotlib.
#   bash scripts/benchmarks.sh            # everything, ~10 minutes on 2 cores
#   bash scripts/benchmarks.sh ddp        # one part: kernels, allreduce, ddp, peers
set -uo pipefail
cd "$(dirname "$0")/.."
out=docs/bench
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
parts=${*:-kernels allreduce ddp peers}
# The widest x86 vector unit: the CPU kernels' compute-bound loops are built for each (common.h).
isa=baseline
for f in avx avx2 avx512f; do grep -qw "$f" /proc/cpuinfo && isa=$f; done
machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), widest vector ISA $isa, $(uname -r)"
# Each part's text file starts with the machine it ran on (a run of one part leaves the others'
# files, measured elsewhere, as they were); machine.txt names the last full run's machine.
[ -z "${*:-}" ] && echo "$machine" > "$out/machine.txt"

for part in $parts; do
  case $part in
    kernels)
      # Five runs: the summary gives each op's median fraction of its ceiling across them.
      for i in 1 2 3 4 5; do
        { echo "# measured on: $machine"
          build/benchmarks/kernels/kernel_bench --device cpu --json "$out/kernel_bench_cpu_run$i.json"; } \
          > "$out/kernel_bench_cpu_run$i.txt"
      done
      { echo "# measured on: $machine"
        python3 scripts/kernel-bench-summary.py "$out"/kernel_bench_cpu_run[1-5].json; } | tee "$out/kernel_bench_cpu.txt" ;;
    allreduce)
      for n in 2 4; do
        mpirun -np $n --oversubscribe build/benchmarks/comm/allreduce_bench -b 8 -e 64M \
          --json "$out/allreduce_np$n.json" | tee "$out/allreduce_np$n.txt"
      done ;;
    ddp)
      # Per-rank batch 256 (compute-bound steps) and 64 (communication weighs more).
      for b in 256 64; do
        for n in 1 2 4; do
          mpirun -np $n --oversubscribe build/benchmarks/ddp/ddp_bench --hidden 1024 --layers 3 --batch $b \
            --bucket-mb 1 --steps 20 --json "$out/ddp_b${b}_np$n.json" | tee "$out/ddp_b${b}_np$n.txt"
        done
      done ;;
    peers)
      bash benchmarks/peers/compare.sh -n 2 -e 3 -r 3 --out "$out/peers" | tee "$out/peers.txt" ;;
    *) echo "benchmarks.sh: unknown part '$part' (kernels, allreduce, ddp, peers)" >&2; exit 2 ;;
  esac
done
/usr/bin/python3 scripts/bench-plots.py "$out" || echo "benchmarks.sh: plots skipped (needs python3-matplotlib)"
