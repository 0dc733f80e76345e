#!/usr/bin/env bash
# Configures and builds tutti (Release, CUDA when nvcc is found) into build/.
# Extra arguments go to the configure step, e.g. -DTUTTI_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake --preset default "$@" >/dev/null
cmake --build --preset default
