#!/usr/bin/env bash
# The emulated CUDA device under AddressSanitizer and UBSan: builds the asan preset (Debug,
# both sanitizers, libtutti_emu included) and runs the emulated kernel, semantics, fault, nn/
# optim/amp and DDP tests there. An out-of-bounds access in a .cu kernel is reported with its
# .cu line, a misaligned vector load by UBSan. Too slow for every CI run (about 10 minutes to
# build and 10 to test on 2 cores); run it after changing kernels/cuda or emu/.
# Extra arguments go to ctest (e.g. -R layernorm).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset asan >/dev/null
cmake --build --preset asan
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The mutants fail on purpose, and the comm and trainer runs add time but no kernels.
ctest --preset asan -L emu -E "mutant|coverage|comm_test_emu|example_train_on_emulated" --timeout 1200 "$@"
