#!/usr/bin/env bash
# Rehearses scripts/gpu-check.sh on a machine without a GPU, with the build seeing what the GPU
# machine's image would: the packages that scripts/gpu-deps.sh carries there, and those that
# scripts/setup.sh installs here but the image lacks and the check does without (Boost.Context,
# for the emulated device), are hidden from /usr (an overlay mount in a private mount
# namespace: nothing on this machine changes), and with --hide-cuda-libs so are NCCL and cuDNN
# beside the CUDA toolkit (the image may have them only inside PyTorch's Python wheels). Here
# the GPU twins skip, and the GPU steps (CUDA semantics, ddp_gpu_test, compute-sanitizer, the
# PyTorch peer, ncu, the GPU benchmarks) fail or are named not available for want of a device
# or a tool; what this checks is everything around them, so that the few minutes of a lent GPU
# are not spent on a broken script: unpacking the carried .debs, configure (with its wheel /
# build-without fallbacks), the two-part build, the test runs, each step's one-line verdict,
# the summary and the tarball. The budget defaults to 2400 s here (2 cores build far slower
# than the GPU machine's 16); GPU_CHECK_BUDGET_S=500 rehearses the device's.
# Needs root (unshare, mount). Writes gpu-check-rehearsal/ (summary.txt, gpu-check.tar.gz).
#   bash scripts/gpu-check-rehearsal.sh [--hide-cuda-libs]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .gpu-deps ] || bash scripts/gpu-deps.sh
hide_cuda=0
[ "${1:-}" = --hide-cuda-libs ] && hide_cuda=1
out=$PWD/gpu-check-rehearsal
rm -rf "$out"
mkdir -p "$out"
ov=$(mktemp -d /tmp/gpu-rehearsal.XXXXXX)
mkdir -p "$ov/up" "$ov/work"
pkgs=$(for f in .gpu-deps/*.deb; do dpkg-deb -f "$f" Package; done | sort -u | tr '\n' ' ')
pkgs+="libboost-context-dev libboost-context1.74-dev"
cuda=$(readlink -f /usr/local/cuda)

start=$(date +%s)
# shellcheck disable=SC2016  # the inner bash expands them
unshare -m env OV="$ov" PKGS="$pkgs" CUDA_DIR="$cuda" HIDE_CUDA="$hide_cuda" OUT="$out" \
  GPU_CHECK_BUDGET_S="${GPU_CHECK_BUDGET_S:-2400}" bash -c '
  set -euo pipefail
  mount --make-rprivate /
  mount -t overlay overlay -o "lowerdir=/usr,upperdir=$OV/up,workdir=$OV/work" /usr
  hidden=0
  for p in $PKGS; do
    for f in $(dpkg -L "$p" 2>/dev/null); do
      case $f in /usr/*) if [ -f "$f" ] || [ -L "$f" ]; then rm -f "$f"; hidden=$((hidden + 1)); fi ;; esac
    done
  done
  echo "rehearsal: hid $hidden files of: $PKGS"
  if [ "$HIDE_CUDA" = 1 ]; then
    find "$CUDA_DIR" \( -name "nccl*.h" -o -name "libnccl*" -o -name "cudnn*.h" -o -name "libcudnn*" \) -print0 | xargs -0 rm -f
    echo "rehearsal: hid NCCL and cuDNN under $CUDA_DIR"
  fi
  bash scripts/gpu-check.sh
' || true
rm -rf "$ov"
echo "rehearsal: $(( $(date +%s) - start )) s; summary in $out/summary.txt"
cat "$out/summary.txt"
