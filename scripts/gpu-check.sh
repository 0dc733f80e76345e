#!/usr/bin/env bash
# The one GPU check: builds tutti for sm_90, runs every test (the GPU twins run for real
# there) and the GPU benchmarks, and writes summary.txt and gpu-check.tar.gz (every log and
# JSON) to $OUT (or gpu-check-out/).
# Meant for one H100/H200 lent for a few minutes:
#   here:    bash scripts/gpu-deps.sh
#   device:  run(command="bash scripts/gpu-check.sh", carry=[".gpu-deps"], timeout_s=540)
# Budget on an H200 with 16 cores: ~3 min build, ~2 min tests, ~1 min benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
# The device tool brings back at most 8 files from $OUT: everything is written to a work
# folder and packed into $OUT/gpu-check.tar.gz at exit, beside a copy of summary.txt.
FINAL=${OUT:-$PWD/gpu-check-out}
OUT=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$FINAL"
summary=$OUT/summary.txt
: > "$summary"
trap 'cp "$summary" "$FINAL/summary.txt"; tar czf "$FINAL/gpu-check.tar.gz" -C "$OUT" .' EXIT
say() { echo "$*" | tee -a "$summary"; }

# Dependencies the GPU machine lacks, unpacked from carried .deb files into a private root.
if [ -d .gpu-deps ]; then
  root=/tmp/tutti-deps
  mkdir -p $root
  for f in .gpu-deps/*.deb; do dpkg -x "$f" $root; done
  arch=x86_64-linux-gnu
  export PATH=$root/usr/bin:$PATH
  export LD_LIBRARY_PATH=$root/usr/lib/$arch:$root/usr/lib/$arch/openblas-pthread:$root/usr/lib/$arch/openmpi/lib:${LD_LIBRARY_PATH:-}
  export OPAL_PREFIX=$root/usr
  export OMPI_MCA_plm=isolated OMPI_MCA_btl_vader_single_copy_mechanism=none
  export CMAKE_PREFIX_PATH=$root/usr:$root/usr/lib/$arch/cmake
  extra=(-DMPI_C_COMPILER=$root/usr/bin/mpicc -DMPIEXEC_EXECUTABLE=$root/usr/bin/mpiexec
         -DOpenBLAS_DIR=$root/usr/lib/$arch/cmake/openblas)
  # Debian's OpenBLAS config hardcodes /usr paths: point it at the private root.
  sed -i "s|/usr/|$root/usr/|g" $root/usr/lib/$arch/cmake/openblas/OpenBLASConfig.cmake 2>/dev/null
else
  extra=()
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

say "== gpu-check $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
start=$(date +%s)
cmake --preset gpu -G Ninja "${extra[@]}" > "$OUT/configure.log" 2>&1 || { say "configure FAILED (see configure.log)"; tail -30 "$OUT/configure.log"; exit 1; }
cmake --build --preset gpu -j "$(nproc)" > "$OUT/build.log" 2>&1 || { say "build FAILED (see build.log)"; grep -m 20 -E "error" "$OUT/build.log"; exit 1; }
say "build: $(( $(date +%s) - start )) s"
python3 scripts/cuda-archs.py build-gpu/src/libtutti.so | tee -a "$summary"

# Every test; GPU twins run here instead of skipping. The log keeps each test's output.
# Each GoogleTest binary also writes XML, so that skipped tests (a GPU path NOT exercised)
# can be counted and named: on a GPU machine there should be none.
GTEST_OUTPUT=xml:$OUT/gtest/ ctest --test-dir build-gpu --output-on-failure -j 8 --timeout 300 > "$OUT/ctest.log" 2>&1
say "ctest: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -E "^\s*[0-9]+ - " "$OUT/ctest.log" | tee -a "$summary"
skipped=$(grep -ho '<testcase name="[^"]*"[^>]*result="skipped"' "$OUT"/gtest/*.xml 2>/dev/null | sed 's/.*name="\([^"]*\)".*/\1/' | sort -u)
say "skipped tests: $(echo -n "$skipped" | grep -c .)"
[ -n "$skipped" ] && echo "$skipped" | tee -a "$summary"

# Benchmarks (each writes JSON next to the summary).
if [ -x build-gpu/benchmarks/kernels/kernel_bench ]; then
  timeout 180 build-gpu/benchmarks/kernels/kernel_bench --device cuda --json "$OUT/kernel_bench.json" > "$OUT/kernel_bench.txt" 2>&1
  say "kernel_bench rc=$?"; cat "$OUT/kernel_bench.txt" >> "$summary"
fi
if [ -x build-gpu/benchmarks/comm/allreduce_bench ]; then
  timeout 120 mpiexec -n 1 build-gpu/benchmarks/comm/allreduce_bench --device cuda --json "$OUT/allreduce_bench.json" > "$OUT/allreduce_bench.txt" 2>&1
  say "allreduce_bench rc=$?"; cat "$OUT/allreduce_bench.txt" >> "$summary"
fi
data=/usr/share/datasets/fashion-mnist
[ -d "${root:-/nonexistent}/usr/share/datasets/fashion-mnist" ] && data=$root/usr/share/datasets/fashion-mnist
if [ -x build-gpu/examples/train_fashion_mnist ] && [ -d "$data" ]; then
  timeout 120 mpiexec -n 1 build-gpu/examples/train_fashion_mnist --device cuda --model cnn --epochs 1 --data "$data" \
    --json "$OUT/train_cnn_gpu.json" > "$OUT/train_cnn_gpu.txt" 2>&1
  say "train_fashion_mnist cnn on the GPU rc=$?"; tail -n 3 "$OUT/train_cnn_gpu.txt" >> "$summary"
fi
if [ -x build-gpu/benchmarks/ddp/ddp_bench ]; then
  timeout 120 mpiexec -n 1 build-gpu/benchmarks/ddp/ddp_bench --device cuda --json "$OUT/ddp_bench.json" > "$OUT/ddp_bench.txt" 2>&1
  say "ddp_bench rc=$?"; cat "$OUT/ddp_bench.txt" >> "$summary"
fi
say "total: $(( $(date +%s) - start )) s"
