#!/usr/bin/env bash
# What OpenBLAS's kernel choice costs: train_gpt (gpt-tiny, 100 steps) and the main job
# (train_fashion_mnist, MLP, 1 epoch) at 2 ranks, with OpenBLAS's SSE3 "Prescott" kernels (what
# it falls back to on a CPU model it does not know) and with the kernels of the CPU's ISA
# (SkylakeX for AVX-512, or the first argument), taking turns, three rounds.
#   bash benchmarks/openblas_coretype.sh [CORETYPE]        (build/ must be built)
set -euo pipefail
cd "$(dirname "$0")/.."
good=${1:-SkylakeX}
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
run() {  # CORETYPE PROGRAM ARGS...: the program's rate line
  local core=$1
  shift
  OPENBLAS_CORETYPE=$core mpirun -np 2 --oversubscribe --bind-to none -x OPENBLAS_CORETYPE "$@" 2>&1 |
    grep -a -E "^done|^epoch" | tail -n 1 | grep -o -E "[0-9.]+k? (tokens|samples)/s" | tail -n 1
}
for r in 1 2 3; do
  for core in Prescott "$good"; do
    g=$(run "$core" build/examples/train_gpt --model gpt-tiny --steps 100 --eval-every 0 --sample-tokens 0)
    m=$(run "$core" build/examples/train_fashion_mnist --model mlp --epochs 1 --progress lines)
    echo "round $r $core: train_gpt $g | train_fashion_mnist $m"
  done
done
