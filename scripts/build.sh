#!/usr/bin/env bash
# Configures and builds tutti (Release) into build/.
#   bash scripts/build.sh              # everything: libtutti (CUDA when nvcc is found), the emulated
#                                      # device, examples, tests, benchmarks (scripts/test.sh)
#   bash scripts/build.sh --main-job   # only libtutti and train_fashion_mnist (scripts/run-example.sh),
#                                      # with CUDA only where a GPU is present: on a machine without
#                                      # one the CUDA kernels would never run, and nvcc is most of a
#                                      # cold build's time on two cores
# Extra arguments go to the configure step, e.g. -DTUTTI_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# ccache keys on paths relative to the checkout, so other checkouts (worktrees) share its hits.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"

if [ "${1:-}" = "--main-job" ]; then
  shift
  cuda=OFF
  if command -v nvcc >/dev/null 2>&1 && { [ -e /dev/nvidia0 ] || nvidia-smi -L >/dev/null 2>&1; }; then cuda=ON; fi
  cmake --preset default -DTUTTI_WITH_CUDA=$cuda -DTUTTI_BUILD_TESTS=OFF -DTUTTI_BUILD_BENCHMARKS=OFF "$@" >/dev/null
  cmake --build --preset default --target train_fashion_mnist
else
  # -U: the choices a --main-job configure cached are made again from what is installed now.
  cmake --preset default -UTUTTI_WITH_CUDA -UTUTTI_CUDA_EMULATION -UTUTTI_WITH_HTTPLIB \
    -DTUTTI_BUILD_TESTS=ON -DTUTTI_BUILD_BENCHMARKS=ON "$@" >/dev/null
  cmake --build --preset default
fi
