#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (the README's test command; CI runs this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh "$@"
# Open MPI refuses root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. scripts/openblas-env.sh
ctest --preset default
