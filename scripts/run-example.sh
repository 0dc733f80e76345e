#!/usr/bin/env bash
# Sets up, builds and runs the main job under mpirun with 2 ranks (the README's first command).
# Extra arguments go to the program.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. scripts/openblas-env.sh
exec mpirun -np 2 --oversubscribe build/examples/train_fashion_mnist --model mlp --epochs 5 "$@"
