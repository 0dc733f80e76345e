#!/usr/bin/env bash
# The README's first command: sets up (only the packages the main job needs), builds (only
# libtutti and train_fashion_mnist), and runs the main job under mpirun with 2 ranks, then
# prints how long each part took. Extra arguments go to the program.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
t0=$(date +%s.%N)
bash scripts/setup.sh --main-job
t1=$(date +%s.%N)
bash scripts/build.sh --main-job
t2=$(date +%s.%N)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. scripts/openblas-env.sh
status=0
mpirun -np 2 --oversubscribe build/examples/train_fashion_mnist --model mlp --epochs 5 "$@" || status=$?
t3=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN {
  printf "run-example: setup %.0f s, build %.0f s, training %.0f s (mpirun, start to exit); total %.0f s\n",
         b - a, c - b, d - c, d - a }' >&2
exit $status
