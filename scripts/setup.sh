#!/usr/bin/env bash
# Installs what tutti needs from Debian's packages. Safe to run again: it installs only what is
# missing. Run as root (or with sudo). The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is not
# installed here: it is used when present.
#   bash scripts/setup.sh              # everything: build, tests, benchmarks, lint (scripts/test.sh),
#                                      # and the Python reference environment .venv-ref/ (pip, below)
#   bash scripts/setup.sh --main-job   # only what the library and the main job need (scripts/run-example.sh)
set -euo pipefail

# The library and the main job (train_fashion_mnist).
packages=(
  build-essential cmake ninja-build ccache pkg-config
  openmpi-bin libopenmpi-dev          # MPI: rank bootstrap, CPU communicator
  libopenblas-dev                     # CPU GEMM
  libdnnl-dev                         # oneDNN: the CPU convolutions (the main job's --model cnn)
  libcli11-dev nlohmann-json3-dev     # flags, JSON output
  zlib1g-dev                          # checksums, gzip'ed data sets
  libcpp-httplib-dev                  # the Prometheus /metrics endpoint (obs::HttpExporter)
  dataset-fashion-mnist               # the examples' data set
)
# The rest: tests, benchmarks, the GPT's corpus, the emulated device and cluster, lint.
if [ "${1:-}" != "--main-job" ]; then
  packages+=(
    libgtest-dev libgmock-dev           # tests
    libboost-context-dev                # fibers of the emulated CUDA device (tests without a GPU)
    libbenchmark-dev                    # benchmarks
    fortunes                            # train_gpt's default corpus: ~2.5 MB of real English text
    iproute2                            # the emulated cluster of the multi-node tests (scripts/cluster.sh)
    python3-prometheus-client           # tests: parse the metrics as Prometheus does
    python3-matplotlib                  # scripts/trace_plot.py: a picture of the timeline
    clang-format shellcheck             # scripts/lint.sh
    python3-torch python3-venv python3-packaging  # the Python reference environment (below)
    clang-14 libclang-rt-14-dev         # the fuzz targets: libFuzzer, ASan, UBSan (scripts/fuzz.sh)
    gdb                                 # tests: a crashed trainer's backtraces from its core
  )
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python reference environment of the tests that compare with Hugging Face transformers and
# of scripts/tokenize_text.py: a venv over Debian's python3 and torch 1.13 (--system-site-packages)
# with the versions of scripts/requirements-ref.txt from pip, in .venv-ref/ (git ignores it).
# Made again only when the requirements changed; docs/development.md says why these versions.
if [ "${1:-}" != "--main-job" ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  venv="$root/.venv-ref"
  requirements="$root/scripts/requirements-ref.txt"
  if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$venv/requirements-ref.txt"; then
    echo "setup: Python reference environment up to date ($venv)"
  else
    echo "setup: making the Python reference environment $venv (transformers on Debian's torch)"
    rm -rf "${venv:?}"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$requirements"
    cp "$requirements" "$venv/requirements-ref.txt"
  fi
fi

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found: $( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | head -1)"
else
  echo "setup: no CUDA toolkit found; tutti builds for the CPU only"
fi
