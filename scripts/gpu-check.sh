#!/usr/bin/env bash
# The one GPU check, for a machine with one H100/H200, in about nine minutes:
#   on a machine with Debian's packages: bash scripts/gpu-deps.sh   (the .deb files into .gpu-deps/)
#   on the GPU machine, in a copy of the checkout that includes .gpu-deps/:
#                                        bash scripts/gpu-check.sh  (GPU_CHECK_BUDGET_S=500 s)
# Builds tutti for sm_90 and runs, most valuable first (docs/development.md, "GPU checks", says
# how to read the summary):
#   [1] tests/emu's cuda_semantics_test (CUDA's documented semantics, the same assertions the
#       emulated device passes in CI), then ddp_gpu_test at np 1 (nccl, and mpi staging through
#       pinned host memory) and np 2 (both ranks on the one GPU: mpi staging only), and
#       train_gpt --tp 2 (and --sequence-parallel) on 2 ranks sharing the GPU against --tp 1 (tensor
#       parallelism's kernels);
#   [2] every other test with GPU cases (kernels, tensor, nn, optim, amp, comm) on the GPU, then
#       compute-sanitizer over the kernel tests' GPU cases: memcheck on all, racecheck and
#       synccheck on the kernels with shared memory and barriers;
#   [3] the GPU peer ratio: tutti's trainer and PyTorch on the same GPU, MLP and CNN;
#   [4] Nsight Compute's counters for the slowest kernels of a CNN training run;
#   [5] the rest of the test suite, kernel_bench, allreduce_bench, ddp_bench.
# The build comes in two parts: first what [1] and [2] need, then the rest. Results go to
# $OUT (or gpu-check-out/): summary.txt, written as it grows (so that a run stopped at the
# call's limit still brings back what it reached) and prefixed at the end with one line per
# check ("at a glance"), and gpu-check.tar.gz with every log, XML and JSON. The whole script
# keeps to GPU_CHECK_BUDGET_S (default 500 s, under the device call's 540): each step gets at
# most what is left, and a step that would start with under 30 s left is skipped and named.
# Expected on an H200 with 16 cores: see docs/development.md ("GPU checks") for the figures.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# The device tool brings back at most 8 files from $OUT: the logs and JSON are written to a
# work folder and packed into $OUT/gpu-check.tar.gz at exit.
FINAL=${OUT:-$PWD/gpu-check-out}
OUT=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$FINAL" "$OUT/gtest"
summary=$FINAL/summary.txt
glance=$OUT/glance.txt
: > "$summary"
: > "$glance"
finish() {
  { echo "== at a glance (details below)"; cat "$glance"; echo; cat "$summary"; } > "$OUT/summary.txt"
  cp "$OUT/summary.txt" "$summary.tmp" && mv "$summary.tmp" "$summary"
  tar czf "$FINAL/gpu-check.tar.gz" -C "$OUT" .
  # Last on stdout, where the device tool's reply shows the end of the output.
  echo; echo "== at a glance (summary.txt and gpu-check.tar.gz in $FINAL)"; cat "$glance"
}
trap finish EXIT
say() { echo "$*" | tee -a "$summary"; }
# verdict TEXT: a result line, in the details and in the "at a glance" block.
verdict() { say "$*"; echo "$*" >> "$glance"; }
report() { python3 scripts/gpu-check-report.py "$@"; }
budget=${GPU_CHECK_BUDGET_S:-500}
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
# step_timeout WANT NAME: prints the seconds NAME may take (WANT, or what is left), or nothing
# (and says so in the summary) when too little is left to start it.
step_timeout() {
  local l; l=$(( $(left) - 10 ))
  if [ "$l" -lt 30 ]; then verdict "$2: SKIPPED, out of time (${l}s left of ${budget}s)"; return 1; fi
  [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}
elapsed() { echo "$(( $(date +%s) - $1 )) s"; }

# ---- dependencies the GPU machine lacks, unpacked from carried .deb files into a private root
if [ -d .gpu-deps ]; then
  . scripts/gpu-deps-env.sh
else
  extra=()
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data=${TUTTI_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}

# ---- the machine: GPU, runtime, tools
# find_tool NAME: the first of PATH and the toolkit's and Nsight's usual folders that has NAME.
find_tool() {
  local c
  for c in "$(command -v "$1" 2>/dev/null)" /usr/local/cuda/bin/"$1" /usr/local/cuda/"$1"/"$1" \
           /usr/local/cuda/compute-sanitizer/"$1" /opt/nvidia/nsight-compute/*/"$1" /usr/local/cuda/nsight-compute*/"$1" \
           /opt/nvidia/"$1"/"$1"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}
kernel=$(uname -r)
case $kernel in
  4.4.0) runtime="gVisor (kernel $kernel): KINDS.md saw compute-sanitizer and ncu refused there" ;;
  *fc*) runtime="Firecracker (kernel $kernel)" ;;
  *) runtime="kernel $kernel" ;;
esac
SANITIZER=$(find_tool compute-sanitizer) || SANITIZER=""
NCU=$(find_tool ncu) || NCU=""
say "== gpu-check $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+changes')"
say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null || echo 'none visible (nvidia-smi failed)')"
say "machine: $runtime, $(nproc) cores; nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2)"
say "tools: compute-sanitizer ${SANITIZER:-not found}; ncu ${NCU:-not found}"
start=$(date +%s)

# ---- configure. NCCL and cuDNN: beside the CUDA toolkit, or else (as in images built around
# PyTorch) inside Python's nvidia-nccl / nvidia-cudnn wheels; if neither has one, build without
# it and say so, so that the rest is still checked. The emulated CUDA device is not built: a
# real GPU runs the real thing (and it would need Boost.Context, which the machine lacks).
wheel_root() {  # site-packages/nvidia/<name> of the python3 on PATH, if it has that wheel
  python3 -c "import importlib, sys; print(list(importlib.import_module('nvidia.' + sys.argv[1]).__path__)[0])" "$1" 2>/dev/null
}
extra+=(-DTUTTI_CUDA_EMULATION=OFF)
configured=0
for _ in 1 2 3 4 5; do
  rm -f build-gpu/CMakeCache.txt
  if cmake --preset gpu -G Ninja "${extra[@]}" > "$OUT/configure.log" 2>&1; then configured=1; break; fi
  missing=$(grep -o -m1 -E "Could NOT find (NCCL|CUDNN)" "$OUT/configure.log" | awk '{print $4}')
  [ -n "$missing" ] || break
  lib=$(echo "$missing" | tr '[:upper:]' '[:lower:]')
  dir=$(wheel_root "$lib")
  if [ -n "$dir" ] && ! printf '%s\n' "${extra[@]}" | grep -q "^-D${missing}_ROOT="; then
    extra+=("-D${missing}_ROOT=$dir")
    export LD_LIBRARY_PATH=$dir/lib:${LD_LIBRARY_PATH:-}
    say "$lib: not beside the CUDA toolkit; using Python's wheel at $dir"
  else
    extra+=("-DTUTTI_WITH_${missing}=OFF")
    verdict "$lib: NOT FOUND: built without it; its GPU paths are NOT checked"
  fi
done
[ $configured = 1 ] || { verdict "configure FAILED (see configure.log)"; tail -30 "$OUT/configure.log" | tee -a "$summary"; exit 1; }
say "$(grep -m1 'tutti: CUDA=' "$OUT/configure.log" | sed 's/^-- //') ($(elapsed "$start"))"

# ---- build, part 1: the library and the tests of [1] and [2]
kernel_families="linear elementwise cross_entropy layernorm conv reduce cast optimizer embedding attention flash_attention rmsnorm rope"
first_tests="cuda_semantics_test ddp_gpu_test core_tensor_test core_cuda_checks_test nn_test optim_test amp_test comm_test obs_test models_gpt_test models_llama_test"
for f in $kernel_families; do first_tests+=" kernels_${f}_test"; done
b=$(date +%s)
t=$(step_timeout 360 "build (part 1)") || exit 1
# shellcheck disable=SC2086  # the target list is meant to split
timeout "$t" cmake --build --preset gpu -j "$(nproc)" --target tutti $first_tests train_gpt > "$OUT/build.log" 2>&1 ||
  { verdict "build (part 1) FAILED or out of time after ${t}s (see build.log)"; grep -m 20 -E "error" "$OUT/build.log" | tee -a "$summary"; exit 1; }
say "build, part 1 (libtutti and the GPU tests): $(elapsed "$b")"
python3 scripts/cuda-archs.py build-gpu/src/libtutti.so | tr '\n' ' ' | sed 's/^/libtutti holds: /' | tee -a "$summary"; echo | tee -a "$summary"
bin() { find build-gpu -name "$1" -type f -perm -u+x -print -quit; }  # a built program's path

# gtest_step NAME WANT TITLE CMD...: runs a GoogleTest program (CMD, with XML reports in
# $OUT/gtest/NAME/), its output in $OUT/NAME.txt, and gives TITLE's verdict: the counts, each
# failed case with its first message, each skipped case. Under mpiexec, put "${per_rank_xml[@]}"
# before the program: each rank then writes its report into a folder of its own (ranks that
# share one folder can write one file at once).
# shellcheck disable=SC2016  # expanded by the inner sh, per rank
per_rank_xml=(sh -c 'GTEST_OUTPUT="${GTEST_OUTPUT}rank${OMPI_COMM_WORLD_RANK:-0}/" exec "$0" "$@"')
gtest_step() {
  local name=$1 want=$2 title=$3 t rc counts
  shift 3
  local arg
  for arg in "$@"; do [ -n "$arg" ] || { verdict "$title: NOT BUILT (see build.log)"; return 0; }; done
  t=$(step_timeout "$want" "$title") || return 0
  mkdir -p "$OUT/gtest/$name"
  GTEST_OUTPUT=xml:$OUT/gtest/$name/ timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
  rc=$?
  counts=$(report gtest "$OUT/gtest/$name")
  local first passed failed skipped
  first=$(head -n1 <<< "$counts")
  read -r passed failed skipped < <(sed -nE 's|^([0-9]+)/[0-9]+ passed, ([0-9]+) failed, ([0-9]+) skipped.*|\1 \2 \3|p' <<< "$first")
  if [ "$rc" = 124 ]; then verdict "$title: TIMED OUT after ${t}s; $first"
  elif [ -z "$passed" ]; then verdict "$title: FAILED (rc=$rc): $first"
  elif [ "$rc" != 0 ] || [ "$failed" != 0 ]; then verdict "$title: FAILED (rc=$rc): $first"
  elif [ "$passed" = 0 ] && [ "$skipped" != 0 ]; then
    verdict "$title: NOT RUN: all $skipped cases skipped ($(sed -n '2s/^  skipped [^:]*: //p' <<< "$counts"))"
    return 0
  elif [ "$skipped" != 0 ]; then verdict "$title: PASSED, with skips: $first"
  else verdict "$title: PASSED: $first"; fi
  tail -n +2 <<< "$counts" | head -n 20 | tee -a "$summary"
  [ "$rc" = 0 ] || [ "$(wc -l <<< "$counts")" -gt 1 ] || tail -n 3 "$OUT/$name.txt" | tee -a "$summary"
}

# ---- [1] CUDA's semantics on the hardware; DDP on the GPU against the CPU reference
say "== [1] CUDA semantics (the emulated device's assertions) and DDP on the GPU"
gtest_step cuda_semantics 60 "[1] CUDA SEMANTICS ON THE GPU (a failure: the emulator or our reading of CUDA is wrong)" \
  "$(bin cuda_semantics_test)"
gtest_step ddp_gpu_np1 90 "[1] ddp_gpu_test np 1 (the job's nccl communicator, and mpi staging through pinned host memory)" \
  mpiexec -n 1 "${per_rank_xml[@]}" "$(bin ddp_gpu_test)"
gtest_step ddp_gpu_np2 90 "[1] ddp_gpu_test np 2 (2 ranks share the GPU: both communicators are mpi staging)" \
  mpiexec -n 2 --oversubscribe "${per_rank_xml[@]}" "$(bin ddp_gpu_test)"

# Tensor parallelism on the one GPU: train_gpt --tp 2 on 2 ranks that share it (mpi staging; the
# heads, the MLP features and the vocabulary split over them: the split loss's and embedding's
# CUDA kernels), against one rank with the whole model: the same batches, so the losses agree up
# to the order of the sums (1e-4, as on the emulated device in CI). And with --sequence-parallel:
# the norms' rows split, reduce-scatters and allgathers in place of the allreduces.
tp_check() {
  local t rc a=$OUT/tp1.json b=$OUT/tp2.json c=$OUT/tp2sp.json
  t=$(step_timeout 90 "[1] tensor parallelism") || return 0
  local flags=(--device cuda --data docs/gpt.md --layers 2 --width 128 --heads 4 --context 64 --batch-size 8
               --steps 20 --eval-every 0 --sample-tokens 0 --quiet)
  timeout "$t" mpiexec -n 1 "$(bin train_gpt)" "${flags[@]}" --json "$a" > "$OUT/tp.txt" 2>&1 &&
    timeout "$t" mpiexec -n 2 --oversubscribe "$(bin train_gpt)" "${flags[@]}" --tp 2 --json "$b" >> "$OUT/tp.txt" 2>&1 &&
    timeout "$t" mpiexec -n 2 --oversubscribe "$(bin train_gpt)" "${flags[@]}" --tp 2 --sequence-parallel \
      --json "$c" >> "$OUT/tp.txt" 2>&1
  rc=$?
  if [ "$rc" != 0 ]; then verdict "[1] train_gpt --tp 2 on one GPU: FAILED (rc=$rc): $(tail -n 2 "$OUT/tp.txt" | tr '\n' ' ')"; return; fi
  verdict "[1] train_gpt --tp 2 (and --sequence-parallel) on one GPU against --tp 1: $(python3 - "$a" "$b" "$c" <<'PY'
import json, sys
one, two, rows = (json.load(open(p)) for p in sys.argv[1:4])
worst = max(abs(r[k] - one[k]) / abs(one[k]) for r in (two, rows) for k in ("initial_train_loss", "final_train_loss"))
print("%s: final train loss %.6f and %.6f (sequence-parallel) against %.6f, worst relative difference %.1e "
      "(bound 1e-4); peak %d and %d bytes"
      % ("PASSED" if worst < 1e-4 else "FAILED", two["final_train_loss"], rows["final_train_loss"],
         one["final_train_loss"], worst, two["peak_device_bytes"], rows["peak_device_bytes"]))
PY
)"
}
tp_check

# ---- [2] the other GPU tests, then compute-sanitizer over the kernel tests' GPU cases
say "== [2] the GPU twins of the other tests, and compute-sanitizer"
first_regex="^($(echo "$first_tests" | sed 's/cuda_semantics_test //; s/ddp_gpu_test //; s/ /|/g'))(\.np[0-9]+|\.singleton)?$"
if t=$(step_timeout 120 "[2] GPU tests"); then
  mkdir -p "$OUT/gtest/gpu_tests"
  GTEST_OUTPUT=xml:$OUT/gtest/gpu_tests/ timeout "$t" ctest --test-dir build-gpu -R "$first_regex" --output-on-failure \
    -j 8 --timeout 100 > "$OUT/ctest_gpu.log" 2>&1
  rc=$?
  line=$(grep -E 'tests passed|tests failed' "$OUT/ctest_gpu.log")
  [ "$rc" = 124 ] && line="STOPPED after ${t}s (out of time); ${line:-no count}"
  cases=$(report gtest "$OUT/gtest/gpu_tests")
  cases=$(head -n1 <<< "$cases")
  verdict "[2] GPU tests (kernels x8, tensor, cuda checks, nn, optim, amp, comm np1-4 on one GPU): ${line:-no ctest result, see ctest_gpu.log}; cases over all runs: $cases"
  grep -E "^\s*[0-9]+ - " "$OUT/ctest_gpu.log" | tee -a "$summary"
fi

# compute-sanitizer. A probe with a planted out-of-bounds write shows first whether the tool
# works on this machine (KINDS.md: it did on Firecracker, and refused the device on gVisor):
# if it does not, that is said once, as the machine's limit, not as a failure of tutti.
sanitizer_runs() {
  local san_budget=${GPU_CHECK_SANITIZER_S:-180} s0 probe_log tool_budget tool_start current="" probe_bin tool prog filter log t cap line total=0 bad=0 runs=0 timeouts=0 warned=0 empty=0
  s0=$(date +%s)
  if [ -z "$SANITIZER" ]; then verdict "[2] compute-sanitizer: NOT AVAILABLE on this machine (not found); kernels not sanitized"; return; fi
  t=$(step_timeout 60 "[2] compute-sanitizer probe") || return
  probe_bin=$OUT/sanitizer_probe
  cat > "$OUT/sanitizer_probe.cu" <<'CU'
// Writes one int past the end of a 256-int allocation: memcheck must report it.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void past_the_end(int* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i <= n) p[i] = i; }
int main() {
  int* p = nullptr;
  if (cudaMalloc(&p, 256 * sizeof(int)) != cudaSuccess) { std::printf("probe: cudaMalloc failed\n"); return 2; }
  past_the_end<<<1, 257>>>(p, 256);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe: kernel finished: %s\n", cudaGetErrorString(e));
  cudaFree(p);
  return 0;
}
CU
  probe_log=$OUT/sanitizer_probe.txt
  if ! timeout "$t" nvcc -arch=sm_90 -o "$probe_bin" "$OUT/sanitizer_probe.cu" > "$probe_log" 2>&1; then
    verdict "[2] compute-sanitizer: probe did not compile (see sanitizer_probe.txt); not run"; return
  fi
  timeout "$t" "$SANITIZER" --tool memcheck "$probe_bin" >> "$probe_log" 2>&1
  if grep -q "Invalid __global__ write" "$probe_log"; then
    say "compute-sanitizer probe: found the planted out-of-bounds write: the tool works on this machine"
  elif grep -qiE "not supported|error 999|unable to|failed to|no CUDA-capable|==ERROR==" "$probe_log"; then
    verdict "[2] compute-sanitizer: NOT AVAILABLE on this machine ($runtime): $(grep -m1 -iE "not supported|error 999|unable to|failed to|no CUDA-capable|==ERROR==" "$probe_log" | sed 's/^=* *//' | cut -c1-160); kernels not sanitized (not a failure of tutti)"
    return
  else
    verdict "[2] compute-sanitizer: ran but MISSED the probe's planted out-of-bounds write (see sanitizer_probe.txt): its counts below prove nothing"
  fi
  # TOOL PROGRAM FILTER: memcheck on every kernel test's GPU cases; racecheck and synccheck on
  # the families whose kernels use shared memory or barriers (__syncthreads and its reductions:
  # cast's unscale, elementwise's bias gradient, layernorm's parameter gradients, reduce's
  # block sums, cross_entropy's counts; common.cuh's block reductions), with filters that keep
  # each run short. API errors are not counted: the tests check every CUDA call's status.
  {
    for f in $kernel_families; do echo "memcheck kernels_${f}_test *Cuda*"; done
    echo "racecheck kernels_reduce_test *Cuda*"
    echo "racecheck kernels_layernorm_test LayerNormCuda.*"
    echo "racecheck kernels_cross_entropy_test *Cuda*"
    echo "racecheck kernels_cast_test *UnscaleTest*Cuda*"
    echo "racecheck kernels_elementwise_test ElementwiseCuda.BiasAddAndBackwardMatchCpu"
    echo "racecheck kernels_embedding_test *Cuda*"
    echo "synccheck kernels_reduce_test *Cuda*"
    echo "synccheck kernels_layernorm_test LayerNormCuda.*"
    echo "synccheck kernels_cross_entropy_test *Cuda*"
    echo "synccheck kernels_cast_test *UnscaleTest*Cuda*"
    echo "synccheck kernels_elementwise_test ElementwiseCuda.BiasAddAndBackwardMatchCpu"
    echo "synccheck kernels_embedding_test *Cuda*"
    echo "racecheck kernels_rmsnorm_test *Cuda*"
    echo "synccheck kernels_rmsnorm_test *Cuda*"
  } > "$OUT/sanitizer_plan.txt"
  # Each tool gets its share of the sanitizer's budget (memcheck 45%, racecheck 35%, synccheck
  # 20%), each run at most 60 s of it, so that a slow tool cannot starve the others.
  while read -r tool prog filter; do
    if [ "$tool" != "$current" ]; then
      current=$tool tool_start=$(date +%s)
      case $tool in memcheck) tool_budget=$((san_budget * 45 / 100)) ;; racecheck) tool_budget=$((san_budget * 35 / 100)) ;;
                    *) tool_budget=$((san_budget * 20 / 100)) ;; esac
    fi
    cap=$(( tool_budget - ($(date +%s) - tool_start) ))
    [ "$cap" -gt 60 ] && cap=60
    if [ "$cap" -lt 10 ]; then say "  $tool $prog: SKIPPED ($tool's ${tool_budget}s of the sanitizer's ${san_budget}s are spent)"; continue; fi
    t=$(step_timeout "$cap" "[2] $tool $prog") || break
    log=$OUT/sanitizer_${tool}_${prog}.txt
    timeout "$t" "$SANITIZER" --tool "$tool" --report-api-errors no --print-limit 20 \
      "$(bin "$prog")" --gtest_filter="$filter" < /dev/null > "$log" 2>&1
    if [ $? = 124 ]; then line="TIMED OUT after ${t}s (no verdict)"; timeouts=$((timeouts + 1))
    else
      line=$(report sanitizer "$log")
      runs=$((runs + 1))
      n=$(grep -o -m1 '^[0-9]*' <<< "$line")
      { [ -z "$n" ] || [ "$n" != 0 ]; } && bad=$((bad + 1))
      grep -qE "^0 errors, [1-9][0-9]* warnings" <<< "$line" && warned=$((warned + 1))
      # A run whose GPU cases all skipped (or that printed no test result) checked nothing.
      grep -qE "tests: (0 passed|no test result)" <<< "$line" && empty=$((empty + 1))
    fi
    say "  $tool $prog ($filter): $line"
  done < "$OUT/sanitizer_plan.txt"
  total=$(wc -l < "$OUT/sanitizer_plan.txt")
  if [ "$bad" = 0 ] && [ "$empty" = 0 ] && [ "$runs" = "$total" ]; then
    verdict "[2] compute-sanitizer: CLEAN: 0 errors in all $total runs (memcheck x8, racecheck x5, synccheck x5)$([ "$warned" = 0 ] || echo ", racecheck WARNINGS in $warned run(s)") ($(elapsed "$s0"))"
  else
    verdict "[2] compute-sanitizer: of $total runs, $bad reported errors or no verdict, $empty ran no test case, $timeouts timed out, $((total - runs - timeouts)) not run (per run above; logs sanitizer_*.txt) ($(elapsed "$s0"))"
  fi
}
say "-- compute-sanitizer"
sanitizer_runs

# ---- build, part 2: everything else (examples, benchmarks, the other tests)
b=$(date +%s)
if t=$(step_timeout 240 "build (part 2)"); then
  if timeout "$t" cmake --build --preset gpu -j "$(nproc)" >> "$OUT/build.log" 2>&1; then
    say "build, part 2 (the rest): $(elapsed "$b")"
  else
    verdict "build (part 2) FAILED or out of time after ${t}s (see build.log): the steps below run what was built"
    grep -E "error" "$OUT/build.log" | head -n 10 | tee -a "$summary"
  fi
fi

# ---- [3] the GPU peer ratio: the same training by tutti and by PyTorch on this GPU
say "== [3] GPU peer ratio: tutti's trainer and PyTorch (benchmarks/peers), 1 rank, same model/batch/optimizer/data"
peer_step() {  # MODEL EPOCHS WANT
  local model=$1 epochs=$2 want=$3 t dir=$OUT/peer_$1 line
  t=$(step_timeout "$want" "[3] peer $model") || return 0
  timeout "$t" env PYTHON="$(command -v python3)" bash benchmarks/peers/compare.sh -n 1 -e "$epochs" -r 3 \
    --model "$model" --device cuda --build build-gpu --data "$data" --out "$dir" > "$OUT/peer_$model.txt" 2>&1
  [ $? = 124 ] && say "peer $model: stopped after ${t}s; the medians are of the runs that finished"
  PYTHON=python3 bash benchmarks/peers/compare.sh --summary-only --out "$dir" >> "$OUT/peer_$model.txt" 2>&1
  if line=$(report peer "$dir/summary.json"); then
    verdict "[3] peer $model ($epochs epochs, batch 128, SGD lr 0.05 m 0.9): $line"
  else
    verdict "[3] peer $model: NO RATIO: $line (see peer_$model.txt)"
    grep -m3 -iE "error|what\(\)|Traceback|cannot" "$OUT/peer_$model.txt" | cut -c1-200 | tee -a "$summary"
  fi
}
torch_check=$(timeout 60 python3 -c "import torch; print(torch.__version__, 'cuda' if torch.cuda.is_available() else 'NO GPU')" 2>&1 | tail -n1)
if [ ! -x build-gpu/examples/train_fashion_mnist ] || [ ! -d "$data" ]; then
  verdict "[3] peer: NOT RUN: the trainer is not built or the data set ($data) is missing"
elif ! grep -q " cuda$" <<< "$torch_check"; then
  verdict "[3] peer: NOT RUN: python3 ($(command -v python3)) has no PyTorch on a GPU: $torch_check"
else
  say "PyTorch $torch_check (TF32 off, batches gathered on the host and copied per step, as tutti's trainer does)"
  peer_step mlp 2 80
  peer_step cnn 2 80
fi

# ---- [4] Nsight Compute: the kernels with the most GPU time in a window of a CNN training run
say "== [4] Nsight Compute (--clock-control none): kernels of a CNN training run on the GPU"
ncu_step() {
  local t rep=$OUT/ncu_cnn log=$OUT/ncu_cnn.txt skip line
  if [ -z "$NCU" ]; then verdict "[4] ncu: NOT AVAILABLE on this machine (not found)"; return; fi
  if ! [ -x build-gpu/examples/train_fashion_mnist ] || ! [ -d "$data" ]; then verdict "[4] ncu: NOT RUN: no trainer or data"; return; fi
  : > "$log"
  # The profiler refusing the machine (KINDS.md, gVisor: "Failed to initialize the profiler:
  # LibraryNotLoaded"; ERR_NVGPUCTRPERM: no permission for the counters) is the machine's limit.
  local refused="LibraryNotLoaded|ERR_NVGPUCTRPERM|not supported|Failed to initialize"
  # Launches 600..749: past the first steps' warm-up (cuDNN's and cuBLAS's choices, first
  # allocations), one to a few whole steps whatever a step's launch count; 60 steps run in all.
  for skip in 600 100; do
    t=$(step_timeout 90 "[4] ncu") || return
    rm -f "$rep.ncu-rep"
    timeout "$t" mpiexec -n 1 "$NCU" --clock-control none --target-processes all \
      --section SpeedOfLight --section Occupancy --section LaunchStats \
      --launch-skip "$skip" --launch-count 150 -f -o "$rep" \
      build-gpu/examples/train_fashion_mnist --device cuda --model cnn --epochs 1 --max-steps 60 --test-subset 1000 \
      --lr-schedule constant --data "$data" --quiet >> "$log" 2>&1
    [ -f "$rep.ncu-rep" ] && break
    grep -qiE "$refused" "$log" && break
    grep -qiE "No kernels were profiled" "$log" || break
    [ "$skip" = 100 ] || say "ncu: the run ended before launch $skip; again, from launch 100"
  done
  if [ ! -f "$rep.ncu-rep" ]; then
    if grep -qiE "$refused" "$log"; then
      verdict "[4] ncu: NOT AVAILABLE on this machine ($runtime): $(grep -m1 -iE "$refused" "$log" | cut -c1-160) (not a failure of tutti)"
    else
      verdict "[4] ncu: FAILED, no report (see ncu_cnn.txt): $( (grep -m1 "==ERROR==" "$log" || tail -n1 "$log") | cut -c1-160)"
    fi
    return
  fi
  "$NCU" --import "$rep.ncu-rep" --csv --page raw --print-units base --print-kernel-base demangled > "$OUT/ncu_cnn.csv" 2>> "$log"
  if line=$(report ncu "$OUT/ncu_cnn.csv" 3); then
    verdict "[4] ncu: $(head -n1 <<< "$line")"
    tail -n +2 <<< "$line" | tee -a "$summary"
    tail -n +3 <<< "$line" | head -n 3 | sed 's/^  /    /' >> "$glance"
  else
    verdict "[4] ncu: report unreadable: $line"
  fi
}
ncu_step

# ---- [5] the rest of the test suite, and the GPU benchmarks
say "== [5] the rest of the test suite, and the benchmarks"
if t=$(step_timeout 180 "[5] ctest (the rest)"); then
  mkdir -p "$OUT/gtest/rest"
  GTEST_OUTPUT=xml:$OUT/gtest/rest/ timeout "$t" ctest --test-dir build-gpu -E "$first_regex|^cuda_semantics_test$|^ddp_gpu_test\.np" \
    --output-on-failure -j 8 --timeout 240 > "$OUT/ctest.log" 2>&1
  if [ $? = 124 ]; then line="STOPPED after ${t}s (out of time); cases of the tests that finished"
  else line="$(grep -E 'tests passed|tests failed' "$OUT/ctest.log" 2>/dev/null || echo 'no result, see ctest.log'); cases"; fi
  verdict "[5] the rest of ctest: $line: $(report gtest "$OUT/gtest/rest" | sed -n 1p)"
  grep -E "^\s*[0-9]+ - " "$OUT/ctest.log" 2>/dev/null | tee -a "$summary"
fi
# Every GoogleTest case that skipped in every run above (a GPU path NOT exercised), with why.
skipped=$(report gtest "$OUT"/gtest/*/ | grep '^  skipped ')
verdict "skipped test cases, all steps: $(echo -n "$skipped" | grep -c .) (each skipped wherever it ran; listed below)"
[ -n "$skipped" ] && echo "$skipped" | tee -a "$summary"

# gpu_step NAME WANT LINES CMD...: runs CMD within the budget (at most WANT s), its output in
# $OUT/NAME.txt; the summary gets its exit status and its last LINES lines (0: all of it).
gpu_step() {
  local name=$1 want=$2 lines=$3 t rc
  shift 3
  t=$(step_timeout "$want" "[5] $name") || return 0
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
  rc=$?
  if [ "$rc" = 0 ]; then verdict "[5] $name: done (its table below; JSON in the tarball)"
  elif [ "$rc" = 124 ]; then verdict "[5] $name: TIMED OUT after ${t}s"
  else verdict "[5] $name: FAILED (rc=$rc): $(grep -m1 -iE "error|$name:" "$OUT/$name.txt" | cut -c1-200)"; fi
  if [ "$lines" = 0 ]; then cat "$OUT/$name.txt"; else tail -n "$lines" "$OUT/$name.txt"; fi >> "$summary"
}
bin_dir=build-gpu
[ -x $bin_dir/benchmarks/kernels/kernel_bench ] &&
  gpu_step kernel_bench 120 0 $bin_dir/benchmarks/kernels/kernel_bench --device cuda --json "$OUT/kernel_bench.json"
[ -x $bin_dir/benchmarks/comm/allreduce_bench ] &&
  gpu_step allreduce_bench 60 0 mpiexec -n 1 $bin_dir/benchmarks/comm/allreduce_bench --device cuda \
    --json "$OUT/allreduce_bench.json"
[ -x $bin_dir/benchmarks/ddp/ddp_bench ] &&
  gpu_step ddp_bench 60 0 mpiexec -n 1 $bin_dir/benchmarks/ddp/ddp_bench --device cuda --json "$OUT/ddp_bench.json"
verdict "total: $(elapsed "$start") after the set-up, $(( $(date +%s) - t0 )) s of the ${budget} s budget"
