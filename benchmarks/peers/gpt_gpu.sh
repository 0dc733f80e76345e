#!/usr/bin/env bash
# GPT-2 124M in bf16 on one GPU: tutti's train_gpt next to PyTorch eager and, where it works,
# torch.compile: tokens/s and MFU of each, the same model, data, batch and optimizer. On a
# machine with one H100/H200 and a copy of the checkout that includes .gpu-deps/ (made by
# bash scripts/gpu-deps.sh where Debian's packages can be reached):
#   bash benchmarks/peers/gpt_gpu.sh      # at most about nine minutes (GPT_GPU_BUDGET_S)
# A separate script, not a step of scripts/gpu-check.sh, so that each fits a short lease of
# a GPU machine; it reuses gpu-check's build folder (build-gpu) when that is already configured.
#
# What it does, within GPT_GPU_BUDGET_S (default 500 s; each step is cut at what is left):
#   1. the carried .deb files unpacked as gpu-check.sh does (Open MPI, OpenBLAS, CLI11, ...),
#      configure (if needed; NCCL and cuDNN off unless build-gpu has them: one rank needs
#      neither) and build libtutti and train_gpt only;
#   2. data: llm.c-format token shards made here from the repository's own text (pairs of
#      bytes mapped into GPT-2's 50257 ids), since the machine reaches no data set. Throughput
#      and MFU do not depend on which tokens they are; the losses are not GPT-2's on real text;
#   3. tutti: train_gpt --model gpt2-124m --precision bf16, batch GPT_BATCH (16) x 1024 tokens,
#      GPT_STEPS (40) steps, the first ones left out of the steady tokens/s;
#   4. PyTorch eager (torch_gpt.py: F.scaled_dot_product_attention, autocast bf16), then
#      torch.compile of the same, each with the same flags;
#   5. summary: tokens/s (steady), MFU against the H200's 989.4 TFLOP/s dense bf16 (or the
#      table's entry for the GPU found; GPT_PEAK_TFLOPS overrides), ratio tutti / eager;
#   6. activation checkpointing (GPT_RECOMPUTE=0 skips it): gpt_recompute_bench on gpt2-124m,
#      8 x 1024, bf16 (activation bytes and step time of none, blocks, mlp, attn side by side:
#      the issue's targets are <= 1/3 the activations and <= 1.4x the step with blocks); the
#      largest preset, gpt2-1558m
#      (1.56 B parameters), with --recompute blocks and --zero 3, batch GPT_LARGE_BATCH (16) x 1024:
#      bf16 AdamW's states take ~20 bytes per parameter (31 GB) and the checkpointed activations
#      ~1 GB per sequence (15 GB), where without recomputation the activations alone would be
#      ~8.4 GB per sequence (134 GB: it would not fit in the H200's 141 GB). Reports tokens/s, MFU
#      and the peak bytes of tutti's tensors (the JSON's peak_device_bytes) and nvidia-smi's.
#      ZeRO-3 on one rank saves nothing: it runs its gathers (two layers whole at a time, the
#      resident embeddings) on a real GPU; the plan puts the run at 48.6 GiB.
#      Last, step 3's run again with --recompute blocks (tokens/s and peak bytes against step 3's).
#      GPT_GPU_SKIP_TORCH=1 leaves out step 4, for a short lease.
# Output in $OUT (or gpt-gpu-out/): gpt_gpu.txt (the summary, also printed last) and every
# JSON and log. GPT_GPU_REHEARSE=1 runs the whole plumbing here on the CPU with a tiny GPT and
# the CPU build (build-cpu), to check the script before spending device minutes.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$PWD/gpt-gpu-out}
mkdir -p "$OUT"
summary=$OUT/gpt_gpu.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
budget=${GPT_GPU_BUDGET_S:-500}
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
rehearse=${GPT_GPU_REHEARSE:-0}
steps=${GPT_STEPS:-40}
batch=${GPT_BATCH:-16}
trap 'echo; echo "== gpt_gpu summary ($OUT)"; cat "$summary"' EXIT

# ---- 1. dependencies and build
if [ "$rehearse" = 1 ]; then
  build=${GPT_BUILD:-build-cpu}
  model=(--model gpt-tiny --layers 2 --width 64 --heads 2 --context 64)
  large=(--model gpt-tiny --layers 4 --width 64 --heads 2 --context 64)
  device=cpu
  python=${PYTHON:-/usr/bin/python3}
  steps=${GPT_STEPS:-12}
  batch=${GPT_BATCH:-8}
  say "== REHEARSAL on the CPU: a tiny GPT, $build (GPT_GPU_REHEARSE=1): the plumbing, not the numbers"
else
  build="build-gpu"
  model=(--model gpt2-124m)
  large=(--model gpt2-1558m)
  device=cuda
  python=${PYTHON:-python3}
  if [ -d .gpu-deps ] && ! command -v mpiexec > /dev/null; then
    . scripts/gpu-deps-env.sh
  else
    extra=()
  fi
  say "== gpt_gpu $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+changes')"
  say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null || echo 'none visible')"
  say "PyTorch: $($python -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
  b=$(date +%s)
  if [ ! -f $build/CMakeCache.txt ]; then
    cmake --preset gpu -G Ninja "${extra[@]}" -DTUTTI_CUDA_EMULATION=OFF -DTUTTI_WITH_NCCL=OFF -DTUTTI_WITH_CUDNN=OFF \
      -DTUTTI_BUILD_TESTS=OFF > "$OUT/configure.log" 2>&1 ||
      { say "configure FAILED (configure.log):"; tail -20 "$OUT/configure.log" | tee -a "$summary"; exit 1; }
  fi
  timeout $(( $(left) - 60 )) cmake --build $build -j "$(nproc)" --target train_gpt gpt_recompute_bench > "$OUT/build.log" 2>&1 ||
    { say "build FAILED or out of time (build.log):"; grep -m 20 error "$OUT/build.log" | tee -a "$summary"; exit 1; }
  say "build (libtutti, train_gpt, gpt_recompute_bench): $(( $(date +%s) - b )) s"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
trainer=$build/examples/train_gpt
[ -x "$trainer" ] || { say "no $trainer: build it first"; exit 1; }

# ---- 2. data: llm.c shards from the repository's text
"$python" - "$OUT" <<'PY'
import glob, os, struct, sys
out = sys.argv[1]
text = b"".join(open(p, "rb").read() for p in sorted(glob.glob("docs/*.md") + glob.glob("src/*/*.cc") + glob.glob("kernels/*/*.c*")))
ids = [(text[i] * 191 + text[i + 1]) % 50257 for i in range(0, len(text) - 1, 2)]
def shard(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
need = 1_500_000  # > GPT_STEPS x 16 x 1024 tokens: no window is seen twice
train = (ids * (need // len(ids) + 1))[:need]
shard(os.path.join(out, "gpt_train_000001.bin"), train)
shard(os.path.join(out, "gpt_val_000000.bin"), ids[:70_000])
print(f"data: {len(text)} bytes of the repository's text -> {len(ids)} tokens, train shard {need}, val 70000")
PY
data=(--data "$OUT/gpt_train_000001.bin" --val-data "$OUT/gpt_val_000000.bin")
common=("${model[@]}" "${data[@]}" --precision bf16 --batch-size "$batch" --steps "$steps" --warmup-steps 5
        --eval-every 0 --val-tokens 8192 --device "$device")
[ "$rehearse" = 1 ] && common=("${common[@]/bf16/fp32}")
[ -n "${GPT_PEAK_TFLOPS:-}" ] && common+=(--peak-tflops "$GPT_PEAK_TFLOPS")

# run NAME WANT CMD...: a timed step (WANT seconds or what is left), its log in $OUT/NAME.log.
run() {
  local name=$1 want=$2 l; shift 2
  l=$(( $(left) - 5 ))
  [ "$l" -lt 20 ] && { say "$name: SKIPPED, out of time"; return 1; }
  [ "$want" -lt "$l" ] && l=$want
  timeout "$l" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc = 124 ] && say "$name: TIMED OUT after ${l}s (see $name.log)"
  [ $rc != 0 ] && [ $rc != 124 ] && { say "$name: FAILED rc=$rc:"; grep -m 5 -iE "error|Traceback|exception" "$OUT/$name.log" | cut -c1-300 | tee -a "$summary"; }
  return $rc
}

# ---- 3. tutti
run tutti 150 mpiexec -n 1 "$trainer" "${common[@]}" --sample-tokens 32 --json "$OUT/tutti.json"
peak=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1])).get('peak_tflops') or 0)" "$OUT/tutti.json" 2>/dev/null || echo 0)
[ -n "${GPT_PEAK_TFLOPS:-}" ] && peak=$GPT_PEAK_TFLOPS

# ---- 4. PyTorch eager, then torch.compile
torch_flags=("${common[@]}" --peak-tflops "${peak:-0}")
if [ "${GPT_GPU_SKIP_TORCH:-0}" = 1 ]; then
  say "PyTorch: SKIPPED (GPT_GPU_SKIP_TORCH=1)"
else
[ "$rehearse" = 1 ] && torch_flags+=(--threads 1)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29600 + RANDOM % 300))
run torch_eager 100 "$python" benchmarks/peers/torch_gpt.py "${torch_flags[@]}" --json "$OUT/torch_eager.json"
export MASTER_PORT=$((MASTER_PORT + 1))
if [ "$rehearse" = 1 ] || "$python" -c "import torch, sys; sys.exit(0 if hasattr(torch, 'compile') else 1)"; then
  run torch_compile 150 "$python" benchmarks/peers/torch_gpt.py "${torch_flags[@]}" --compile --json "$OUT/torch_compile.json"
else
  say "torch.compile: NOT AVAILABLE in this PyTorch"
fi
fi

# ---- 5. summary
"$python" - "$OUT" <<'PY' | tee -a "$summary"
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".json")))
    except (OSError, ValueError):
        return None
rows = [("tutti", load("tutti")), ("pytorch eager", load("torch_eager")), ("torch.compile", load("torch_compile"))]
base = rows[0][1]
print(f"{'':16}{'tokens/s':>12}{'MFU':>8}{'val loss':>10}  (steady: after the first warm-up steps)")
for name, r in rows:
    if r is None:
        print(f"{name:16}{'-':>12}{'-':>8}{'-':>10}  no result (see {name.split()[0].replace('.', '_')}*.log)")
        continue
    mfu = r.get("mfu_steady")
    print(f"{name:16}{r['tokens_per_s_steady']:>12,.0f}{(f'{100 * mfu:.1f}%' if mfu else 'n/a'):>8}"
          f"{r['final_val_loss']:>10.4f}")
if base:
    print(f"model: {base.get('config')}, {base.get('parameters')} parameters, {base.get('flops_per_token'):.4g} FLOPs/token "
          f"(6N + 12 L C T), batch {base.get('global_batch_size')} x {base.get('seq_len')}, {base.get('precision')}, "
          f"device {base.get('device')}, peak {base.get('peak_tflops')} TFLOP/s")
    for name, r in rows[1:]:
        if r:
            print(f"ratio tutti / {name}: {base['tokens_per_s_steady'] / r['tokens_per_s_steady']:.2f}x")
PY

# ---- 6. activation checkpointing: gpt_recompute_bench (activation bytes and step time per
# policy, gpt2-124m at T 1024), gpt2-1558m with --recompute blocks, gpt2-124m's run with it
if [ "${GPT_RECOMPUTE:-1}" = 1 ]; then
  say "== activation checkpointing"
  bench=$build/benchmarks/models/gpt_recompute_bench
  if [ "$rehearse" = 1 ]; then bench_flags=(--device cpu --steps 3)
  else bench_flags=(--device cuda --model gpt2-124m --seq-len 1024 --batch 8 --precision bf16 --steps 5); fi
  if [ -x "$bench" ] && run recompute_bench 90 "$bench" "${bench_flags[@]}" --policies none,blocks,mlp,attn \
       --json "$OUT/recompute_bench.json"; then
    tee -a "$summary" < "$OUT/recompute_bench.log"
  fi
  if [ "$rehearse" = 1 ]; then
    large_flags=("${large[@]}" "${common[@]:${#model[@]}}")  # step 3's flags with the larger model
  else
    large_flags=("${large[@]}" "${data[@]}" --precision bf16 --batch-size "${GPT_LARGE_BATCH:-16}"
                 --steps "${GPT_LARGE_STEPS:-8}" --warmup-steps 2 --eval-every 0 --val-tokens 2048 --device "$device")
    [ -n "${GPT_PEAK_TFLOPS:-}" ] && large_flags+=(--peak-tflops "$GPT_PEAK_TFLOPS")
  fi
  smi=$OUT/large_nvidia_smi.csv
  : > "$smi"
  if [ "$rehearse" != 1 ] && command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$smi" 2>/dev/null &
    smi_pid=$!
  fi
  run tutti_large 200 mpiexec -n 1 "$trainer" "${large_flags[@]}" --recompute blocks --zero 3 --sample-tokens 0 \
    --json "$OUT/tutti_large.json"
  [ -n "${smi_pid:-}" ] && kill "$smi_pid" 2> /dev/null
  run tutti_recompute 100 mpiexec -n 1 "$trainer" "${common[@]}" --recompute blocks --sample-tokens 0 \
    --json "$OUT/tutti_recompute.json"
  "$python" - "$OUT" "$smi" <<'PY' | tee -a "$summary"
import json, os, sys
out, smi = sys.argv[1], sys.argv[2]
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".json")))
    except (OSError, ValueError):
        return None
gib = 2.0 ** 30
base, rec, large = load("tutti"), load("tutti_recompute"), load("tutti_large")
if base and rec:
    print(f"{base['config']}: tokens/s {base['tokens_per_s_steady']:,.0f} (none) vs {rec['tokens_per_s_steady']:,.0f} "
          f"(blocks): step {base['tokens_per_s_steady'] / rec['tokens_per_s_steady']:.2f}x (target <= 1.4x); "
          f"peak bytes of tutti's tensors {base['peak_device_bytes'] / gib:.2f} vs {rec['peak_device_bytes'] / gib:.2f} GiB")
else:
    print("gpt2-124m none vs blocks: no result (see tutti.log, tutti_recompute.log)")
if large:
    used = [float(x) for x in open(smi).read().split() if x.strip().replace(".", "").isdigit()] if os.path.exists(smi) else []
    mfu = large.get("mfu_steady")
    print(f"{large['config']}, {large['parameters']:,} parameters, --recompute blocks --zero 3, batch "
          f"{large['global_batch_size']} x {large['seq_len']}: {large['tokens_per_s_steady']:,.0f} tokens/s, MFU "
          f"{(f'{100 * mfu:.1f}%' if mfu else 'n/a')} (model FLOPs 6N + 12LCT: the recomputed forward is not counted), "
          f"peak bytes of tutti's tensors {large['peak_device_bytes'] / gib:.1f} GiB"
          + (f", nvidia-smi's most {max(used) / 1024:.1f} GiB" if used else ""))
else:
    print("largest preset: no result (see tutti_large.log)")
PY
fi
