#!/usr/bin/env bash
# The README's test command (CI runs it): sets up (apt, and pip for .venv-ref/), checks formatting,
# shell scripts and commit subjects (scripts/lint.sh), builds everything (Release), runs the whole
# test suite, then builds the fuzz targets of the file readers and runs each for 15 s
# (scripts/fuzz.sh --ci: fails on any crash).
# Extra arguments go to the configure step.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
bash scripts/setup.sh
# The Python reference environment that setup.sh made: its versions in the log, and a broken one
# stops the run here, not after the build. Its tests (tutti_add_ref_test) must not skip.
.venv-ref/bin/python tests/models/hf/check_env.py
export TUTTI_REQUIRE_REF_PYTHON=1
bash scripts/lint.sh
bash scripts/build.sh "$@"
# Open MPI refuses root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. scripts/openblas-env.sh
ctest --preset default
bash scripts/fuzz.sh --ci
