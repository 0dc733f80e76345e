#!/usr/bin/env bash
# The one GPU check: builds tutti for sm_90, runs every test (the GPU twins run for real
# there) and the GPU benchmarks, and writes summary.txt and gpu-check.tar.gz (every log and
# JSON) to $OUT (or gpu-check-out/).
# Meant for one H100/H200 lent for a few minutes:
#   here:    bash scripts/gpu-deps.sh
#   device:  run(command="bash scripts/gpu-check.sh", carry=[".gpu-deps"], timeout_s=540)
# Expected on an H200 with 16 cores: ~3 min build, ~2 min tests, ~1 min benchmarks. The whole
# script keeps to GPU_CHECK_BUDGET_S (default 500 s, under the device call's limit): each later
# step gets what is left, and a step that would start with under 30 s left is skipped and
# named in the summary.
set -uo pipefail
cd "$(dirname "$0")/.."
# The device tool brings back at most 8 files from $OUT: the logs and JSON are written to a
# work folder and packed into $OUT/gpu-check.tar.gz at exit; summary.txt is written into $OUT
# as it grows, so that even a run killed at the call's limit brings back what it got to.
FINAL=${OUT:-$PWD/gpu-check-out}
OUT=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$FINAL"
summary=$FINAL/summary.txt
: > "$summary"
trap 'cp "$summary" "$OUT/summary.txt"; tar czf "$FINAL/gpu-check.tar.gz" -C "$OUT" .' EXIT
say() { echo "$*" | tee -a "$summary"; }
budget=${GPU_CHECK_BUDGET_S:-500}
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
# step_timeout WANT NAME: prints the seconds NAME may take (WANT, or what is left), or nothing
# (and says so in the summary) when too little is left to start it.
step_timeout() {
  local l; l=$(( $(left) - 10 ))
  if [ "$l" -lt 30 ]; then say "$2: SKIPPED, out of time (${l}s left of ${budget}s)"; return 1; fi
  [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}

# Dependencies the GPU machine lacks, unpacked from carried .deb files into a private root.
if [ -d .gpu-deps ]; then
  root=/tmp/tutti-deps
  mkdir -p $root
  for f in .gpu-deps/*.deb; do dpkg -x "$f" $root; done
  # Debian names Open MPI's programs mpicc.openmpi etc. and links the plain names through the
  # alternatives system when a package is installed; dpkg -x does not, so link them here.
  for p in mpicc mpicxx mpiexec mpirun; do ln -sf $p.openmpi $root/usr/bin/$p; done
  arch=x86_64-linux-gnu
  export PATH=$root/usr/bin:$PATH
  export LD_LIBRARY_PATH=$root/usr/lib/$arch:$root/usr/lib/$arch/openblas-pthread:$root/usr/lib/$arch/openmpi/lib:${LD_LIBRARY_PATH:-}
  export OPAL_PREFIX=$root/usr
  # PMIx's compression plugin does not load from the private root, and PMIx then prints a
  # help text it cannot find either; it is only used to shrink launch messages.
  export PMIX_MCA_pcompress_base_silence_warning=1
  export OMPI_MCA_plm=isolated OMPI_MCA_btl_vader_single_copy_mechanism=none
  # Components whose drivers the machine lacks (PSM, UCX, ...) fail to load; that is expected.
  export OMPI_MCA_mca_base_component_show_load_errors=0
  # The data set from the carried dataset-fashion-mnist .deb (the trainer's and tests' default).
  [ -d $root/usr/share/datasets/fashion-mnist ] && export TUTTI_FASHION_MNIST_DIR=$root/usr/share/datasets/fashion-mnist
  export CMAKE_PREFIX_PATH=$root/usr:$root/usr/lib/$arch/cmake
  extra=(-DMPI_C_COMPILER=$root/usr/bin/mpicc -DMPIEXEC_EXECUTABLE=$root/usr/bin/mpiexec
         -DOpenBLAS_DIR=$root/usr/lib/$arch/openblas-pthread/cmake/openblas)
  # Debian's OpenBLAS config (the real file: the one under cmake/ is an alternatives link)
  # hardcodes /usr paths: point it at the private root.
  sed -i "s|/usr/|$root/usr/|g" $root/usr/lib/$arch/openblas-pthread/cmake/openblas/OpenBLASConfig.cmake
else
  extra=()
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

say "== gpu-check $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
start=$(date +%s)
# NCCL and cuDNN: beside the CUDA toolkit, or else (as in images built around PyTorch) inside
# Python's nvidia-nccl / nvidia-cudnn wheels; if neither has one, build without it and say so,
# so that the rest is still checked.
wheel_root() {  # site-packages/nvidia/<name> of the python3 on PATH, if it has that wheel
  python3 -c "import importlib, sys; print(list(importlib.import_module('nvidia.' + sys.argv[1]).__path__)[0])" "$1" 2>/dev/null
}
configured=0
for attempt in 1 2 3 4 5; do
  rm -f build-gpu/CMakeCache.txt
  if cmake --preset gpu -G Ninja "${extra[@]}" > "$OUT/configure.log" 2>&1; then configured=1; break; fi
  missing=$(grep -o -m1 -E "Could NOT find (NCCL|CUDNN)" "$OUT/configure.log" | awk '{print $4}')
  [ -n "$missing" ] || break
  lib=$(echo "$missing" | tr 'A-Z' 'a-z')
  dir=$(wheel_root "$lib")
  if [ -n "$dir" ] && ! printf '%s\n' "${extra[@]}" | grep -q "^-D${missing}_ROOT="; then
    extra+=("-D${missing}_ROOT=$dir")
    export LD_LIBRARY_PATH=$dir/lib:${LD_LIBRARY_PATH:-}
    say "$lib: not beside the CUDA toolkit; using Python's wheel at $dir"
  else
    extra+=("-DTUTTI_WITH_${missing}=OFF")
    say "$lib: NOT FOUND: built without it; its GPU paths are NOT checked"
  fi
done
[ $configured = 1 ] || { say "configure FAILED (see configure.log)"; tail -30 "$OUT/configure.log"; exit 1; }
say "$(grep -m1 'tutti: CUDA=' "$OUT/configure.log" | sed 's/^-- //')"
t=$(step_timeout 400 build) || exit 1
timeout "$t" cmake --build --preset gpu -j "$(nproc)" > "$OUT/build.log" 2>&1 ||
  { say "build FAILED or out of time after ${t}s (see build.log)"; grep -m 20 -E "error" "$OUT/build.log" | tee -a "$summary"; exit 1; }
say "build: $(( $(date +%s) - start )) s"
python3 scripts/cuda-archs.py build-gpu/src/libtutti.so | tee -a "$summary"

# Every test; GPU twins run here instead of skipping. The log keeps each test's output.
# Each GoogleTest binary also writes XML, so that skipped tests (a GPU path NOT exercised)
# can be counted and named: on a GPU machine there should be none.
if t=$(step_timeout 300 ctest); then
  GTEST_OUTPUT=xml:$OUT/gtest/ timeout "$t" ctest --test-dir build-gpu --output-on-failure -j 8 --timeout 240 \
    > "$OUT/ctest.log" 2>&1
  [ $? = 124 ] && say "ctest: STOPPED after ${t}s (out of time); the counts below are of the tests that finished"
fi
say "ctest: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" 2>/dev/null)"
grep -E "^\s*[0-9]+ - " "$OUT/ctest.log" 2>/dev/null | tee -a "$summary"
skipped=$(grep -ho '<testcase name="[^"]*"[^>]*result="skipped"' "$OUT"/gtest/*.xml 2>/dev/null | sed 's/.*name="\([^"]*\)".*/\1/' | sort -u)
say "skipped tests: $(echo -n "$skipped" | grep -c .)"
[ -n "$skipped" ] && echo "$skipped" | tee -a "$summary"

# The GPU programs (each writes JSON beside its log). gpu_step NAME WANT LINES CMD...: runs CMD
# within the budget (at most WANT s), its output in $OUT/NAME.txt; the summary gets its exit
# status and its last LINES lines (0: all of it).
gpu_step() {
  local name=$1 want=$2 lines=$3 t
  shift 3
  t=$(step_timeout "$want" "$name") || return 0
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
  say "$name rc=$?"
  if [ "$lines" = 0 ]; then cat "$OUT/$name.txt"; else tail -n "$lines" "$OUT/$name.txt"; fi >> "$summary"
}
bin=build-gpu
[ -x $bin/benchmarks/kernels/kernel_bench ] &&
  gpu_step kernel_bench 120 0 $bin/benchmarks/kernels/kernel_bench --device cuda --json "$OUT/kernel_bench.json"
[ -x $bin/benchmarks/comm/allreduce_bench ] &&
  gpu_step allreduce_bench 60 0 mpiexec -n 1 $bin/benchmarks/comm/allreduce_bench --device cuda \
    --json "$OUT/allreduce_bench.json"
data=${TUTTI_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ -x $bin/examples/train_fashion_mnist ] && [ -d "$data" ] &&
  gpu_step train_cnn_gpu 90 3 mpiexec -n 1 $bin/examples/train_fashion_mnist --device cuda --model cnn --epochs 1 \
    --data "$data" --json "$OUT/train_cnn_gpu.json"
[ -x $bin/benchmarks/ddp/ddp_bench ] &&
  gpu_step ddp_bench 60 0 mpiexec -n 1 $bin/benchmarks/ddp/ddp_bench --device cuda --json "$OUT/ddp_bench.json"
say "total: $(( $(date +%s) - start )) s"
