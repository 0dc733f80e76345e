#!/usr/bin/env bash
# Run HERE (a machine with Debian's package registry) before a GPU check: downloads the .deb
# files of the build dependencies that the GPU machine lacks (it has CUDA, CMake and ninja
# but no Open MPI, OpenBLAS, GoogleTest, CLI11, nlohmann-json) into .gpu-deps/, which is
# ignored by git and carried to the device by the device tool (carry: [".gpu-deps"]). Nothing
# else needs carrying: scripts/gpu-check.sh builds without the emulated CUDA device (so without
# Boost.Context), and the GPU machine's python3 has PyTorch for the peer comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
# git's exclude file (in a worktree, .git is a file: ask git where the shared one is).
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-deps/' "$exclude" 2>/dev/null || echo '/.gpu-deps/' >> "$exclude"
mkdir -p .gpu-deps
cd .gpu-deps
apt-get update -qq
pkgs=(libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libpmix-dev libhwloc15 libevent-core-2.1-7
      libevent-pthreads-2.1-7 libevent-dev libfabric1 libucx0 libpsm-infinipath1 libpsm2-2 libibverbs1 librdmacm1
      libnl-3-200 libnl-route-3-200 libmunge2 libopenblas-dev libopenblas0-pthread libopenblas-pthread-dev libgfortran5
      libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libcli11-dev nlohmann-json3-dev zlib1g-dev
      libltdl7 libxnvctrl0 libhwloc-plugins dataset-fashion-mnist)
apt-get download "${pkgs[@]}" 2>&1 | tail -n 3
find . -maxdepth 1 -name '*.deb' | wc -l
