#!/usr/bin/env bash
# Runs every CPU benchmark of the project on this machine and writes JSON, text and plots into
# build/bench/, or into BENCH_OUT: BENCH_OUT=docs/bench refreshes the data behind
# docs/benchmarks.md (the only place generated output is committed). Needs a build
# (scripts/build.sh); the peer comparison also needs Debian's python3-torch, the plots
# python3-matplotlib.
#   bash scripts/benchmarks.sh            # everything, ~10 minutes on 2 cores
#   bash scripts/benchmarks.sh ddp        # one part: kernels, allreduce, ddp, zero, peers, checkpoint,
#                                         # chaos
#   bash scripts/benchmarks.sh checkpoint # not in the default run: ~3 minutes, ~25 GB written to
#                                         # build/bench/checkpoint (each file removed after its mode)
#   bash scripts/benchmarks.sh chaos      # not in the default run: ~7 minutes, needs root
#   bash scripts/benchmarks.sh recompute  # not in the default run: ~4 minutes (GPT-2 124M at T 1024)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/openblas-env.sh
out=${BENCH_OUT:-build/bench}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
parts=${*:-kernels allreduce ddp zero peers}
# The widest x86 vector unit: the CPU kernels' compute-bound loops are built for each (common.h).
isa=baseline
for f in avx avx2 avx512f; do grep -qw "$f" /proc/cpuinfo && isa=$f; done
machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), widest vector ISA $isa, $(uname -r)"
# Each part's text file starts with the machine it ran on (a run of one part leaves the others'
# files, measured elsewhere, as they were); machine.txt names the last full run's machine.
[ -z "${*:-}" ] && echo "$machine" > "$out/machine.txt"

for part in $parts; do
  case $part in
    kernels)
      # Five runs: the summary gives each op's median fraction of its ceiling across them.
      for i in 1 2 3 4 5; do
        { echo "# measured on: $machine"
          build/benchmarks/kernels/kernel_bench --device cpu --json "$out/kernel_bench_cpu_run$i.json"; } \
          > "$out/kernel_bench_cpu_run$i.txt"
      done
      { echo "# measured on: $machine"
        python3 scripts/kernel-bench-summary.py "$out"/kernel_bench_cpu_run[1-5].json; } | tee "$out/kernel_bench_cpu.txt" ;;
    allreduce)
      for n in 2 4; do
        mpirun -np $n --oversubscribe build/benchmarks/comm/allreduce_bench -b 8 -e 64M \
          --json "$out/allreduce_np$n.json" | tee "$out/allreduce_np$n.txt"
      done ;;
    ddp)
      # Per-rank batch 256 (compute-bound steps) and 64 (communication weighs more).
      for b in 256 64; do
        for n in 1 2 4; do
          mpirun -np $n --oversubscribe build/benchmarks/ddp/ddp_bench --hidden 1024 --layers 3 --batch $b \
            --bucket-mb 1 --steps 20 --modes local,overlap,after --json "$out/ddp_b${b}_np$n.json" \
            | tee "$out/ddp_b${b}_np$n.txt"
        done
      done ;;
    zero)
      # Memory per rank by component, stages 0/1/2 at 1-4 ranks (AdamW, bf16 parameters and
      # gradients: the configuration of the ZeRO formulas), then step times of stages 0/1/2
      # side by side at 2 ranks for the trainer's MLP and the wider one (fp32, SGD as the
      # trainer, and AdamW).
      for n in 1 2 3 4; do
        { echo "# measured on: $machine"
          mpirun -np $n --oversubscribe build/benchmarks/ddp/ddp_bench --hidden 1024 --layers 3 --optimizer adamw \
            --precision bf16 --bucket-mb 1 --modes zero0,zero1,zero2 --memory-only --json "$out/zero_memory_np$n.json"; } \
          | tee "$out/zero_memory_np$n.txt"
      done
      for model in "mlp --widths 512,256" "wide --hidden 1024 --layers 3 --bucket-mb 1"; do
        name=${model%% *}
        for opt in sgd adamw; do
          # shellcheck disable=SC2086  # the model's flags, split into words
          { echo "# measured on: $machine"
            mpirun -np 2 --oversubscribe build/benchmarks/ddp/ddp_bench ${model#* } --batch 64 --optimizer "$opt" \
              --steps 60 --modes local,zero0,zero1,zero2 --json "$out/zero_speed_${name}_${opt}_np2.json"; } \
            | tee "$out/zero_speed_${name}_${opt}_np2.txt"
        done
      done ;;
    checkpoint)
      # The training thread's stall per save, sync against async (docs/benchmarks.md, "Checkpoint
      # stall"); the checkpoint files go to build/bench/checkpoint whatever BENCH_OUT is.
      { echo "# measured on: $machine"
        build/benchmarks/io/checkpoint_bench --saves 7 --saves-large 5 --json "$out/checkpoint_bench.json"; } \
        | tee "$out/checkpoint_bench.txt" ;;
    peers)
      bash benchmarks/peers/compare.sh -n 2 -e 3 -r 3 --out "$out/peers" | tee "$out/peers.txt" ;;
    chaos)
      # Not run by default (needs root for scripts/cluster.sh; ~7 minutes): a node killed every
      # minute under scripts/tutti-launch, recovering from the checkpoint file and from memory
      # snapshots, against the same job without failures (docs/benchmarks.md).
      python3 benchmarks/faults/chaos.py --out "$out/chaos" --every 60 --failures 2 --epochs 17 \
        --variant disk --variant "memory:--zero 1 --snapshot-every auto --checkpoint-every 500" ;;
    recompute)
      # Activation checkpointing: activation bytes and step time per policy (docs/gpt.md,
      # "Activation checkpointing"): gpt-tiny, then GPT-2 124M at T 1024 (~3 minutes of it).
      { echo "# measured on: $machine"
        build/benchmarks/models/gpt_recompute_bench --policies none,blocks,mlp,attn,every:2 --steps 15 \
          --json "$out/recompute_tiny.json"
        build/benchmarks/models/gpt_recompute_bench --model gpt2-124m --seq-len 1024 --batch 1 --steps 6 \
          --policies none,blocks,mlp --json "$out/recompute_gpt2_124m.json"; } | tee "$out/recompute.txt" ;;
    *) echo "benchmarks.sh: unknown part '$part' (kernels, allreduce, ddp, zero, peers, checkpoint, chaos, recompute)" >&2
       exit 2 ;;
  esac
done
/usr/bin/python3 scripts/bench-plots.py "$out" || echo "benchmarks.sh: plots skipped (needs python3-matplotlib)"
