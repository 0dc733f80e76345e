#!/usr/bin/env bash
# Trains Fashion-MNIST's MLP (784-512-256-10) or CNN with tutti's trainer and with PyTorch DDP,
# one after the other, with the same ranks, global batch, optimizer, learning rate and epochs,
# and prints samples/s of each, their ratio, test accuracy and final loss. --model gpt-tiny
# (or gpt2-124m) compares examples/train_gpt with torch_gpt.py instead: the same GPT, data and
# data order, AdamW and schedule for -s STEPS steps of -b sequences; tokens/s, their ratio,
# validation and train loss (flags for both in GPT_FLAGS, e.g. "--eval-every 100"). --model
# llama-bench (or llama-tiny) compares train_gpt's Llama with torch_llama.py, eager and under
# torch.compile, from the same initial weights (a Hugging Face folder that torch_llama.py writes
# first and both load with --init-from): tokens/s of the three, their ratios, MFU against the GEMM
# peak train_gpt measures, and the losses at equal tokens (README.md).
#
#   benchmarks/peers/compare.sh [-n RANKS] [-e EPOCHS] [-b GLOBAL_BATCH] [-l LR] [-o OPTIMIZER]
#                               [-m MOMENTUM] [-r REPEATS] [-s STEPS]
#                               [--model mlp|cnn|gpt-tiny|gpt2-124m|llama-tiny|llama-bench]
#                               [--device cpu|cuda]
#                               [--build DIR] [--data DIR] [--out DIR] [--torch-only]
#   benchmarks/peers/compare.sh --summary-only --out DIR   # the table of the runs already in DIR
#
# The two run alternately REPEATS times (default 3: tutti, pytorch, tutti, pytorch, ...), so
# that a change in the machine's load hits both alike; the table gives medians.
#
# Defaults (the trainer's): 2 ranks, 1 epoch, batch 128, sgd, lr 0.05, momentum 0.9 (ignored
# by adamw), model mlp, device: each program's default (auto), build dir "build", results in a fresh
# directory under /tmp (tutti.json, torch.json, and each run's log). Extra mpirun flags can
# be given in MPIRUN_FLAGS (default "--bind-to none --oversubscribe"). Both programs get the
# same CPU threads per rank, THREADS (default: CPUs / ranks, at least 1), through
# OMP_NUM_THREADS and OPENBLAS_NUM_THREADS (tutti's OpenBLAS) and --threads (torch).
# Needs Debian's python3-torch (see README.md), or PYTHON naming another interpreter with torch
# (scripts/gpu-check.sh: the GPU machine's python3). The llama models need torch 2.5 or newer
# with safetensors (PYTHON, default python3: a virtual environment with PyPI's torch, README.md). --summary-only prints the table of the JSON
# files already in --out (e.g. of a run stopped at a time limit) and runs nothing.
set -euo pipefail

ranks=2 epochs=1 batch=128 lr=0.05 momentum=0.9 optimizer=sgd build=build data="" out="" torch_only=0 repeats=3
model=mlp device="" summary_only=0 steps=300
while [ $# -gt 0 ]; do
  case "$1" in
    -n) ranks=$2; shift 2 ;;
    -e) epochs=$2; shift 2 ;;
    -b) batch=$2; shift 2 ;;
    -l) lr=$2; shift 2 ;;
    -o) optimizer=$2; shift 2 ;;
    -m) momentum=$2; shift 2 ;;
    -r) repeats=$2; shift 2 ;;
    -s) steps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --torch-only) torch_only=1; shift ;;
    --summary-only) summary_only=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC1091  # sourced by a path computed at run time
. "$here/../../scripts/openblas-env.sh"
root=$(cd "$here/../.." && pwd)
case "$build" in /*) ;; *) build="$root/$build" ;; esac
trainer="$build/examples/train_fashion_mnist"
peer="$here/torch_fashion_mnist.py"
python=${PYTHON:-/usr/bin/python3}  # Debian's python3-torch installs into the system interpreter only
gpt=0 llama=0
case "$model" in
  mlp|cnn) ;;
  gpt-tiny|gpt2-124m) gpt=1 trainer="$build/examples/train_gpt" peer="$here/torch_gpt.py" ;;
  llama-tiny|llama-bench)
    gpt=1 llama=1 trainer="$build/examples/train_gpt" peer="$here/torch_llama.py" python=${PYTHON:-python3} ;;
  *) echo "compare.sh: --model is mlp, cnn, gpt-tiny, gpt2-124m, llama-tiny or llama-bench, not '$model'" >&2
     exit 2 ;;
esac
[ "$summary_only" -eq 0 ] || [ -n "$out" ] || { echo "compare.sh: --summary-only needs --out DIR" >&2; exit 2; }
out=${out:-$(mktemp -d /tmp/tutti-peers.XXXXXX)}
mkdir -p "$out"

if [ "$summary_only" -eq 0 ] && ! "$python" -c "import torch, numpy" 2>/dev/null; then
  echo "compare.sh: $python cannot import torch and numpy; install them with" >&2
  echo "  apt-get install -y --no-install-recommends python3-torch python3-numpy" >&2
  exit 2
fi
if [ "$summary_only" -eq 0 ] && [ "$llama" -eq 1 ] &&
   ! "$python" -c "import safetensors, torch.nn.functional as F, inspect, torch.nn as nn
assert hasattr(nn, 'RMSNorm') and 'enable_gqa' in (F.scaled_dot_product_attention.__doc__ or '')" 2>/dev/null; then
  echo "compare.sh: --model $model needs torch 2.5 or newer and safetensors in PYTHON ($python):" >&2
  echo "  python3 -m venv VENV && VENV/bin/pip install torch numpy safetensors; PYTHON=VENV/bin/python" >&2
  exit 2
fi

# Open MPI refuses root unless told (CI and containers run as root).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

read -r -a mpiflags <<< "${MPIRUN_FLAGS:---bind-to none --oversubscribe}"
threads=${THREADS:-$(( $(nproc) / ranks ))}
[ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
mpiflags+=(-x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)
data_flag=()
[ -n "$data" ] && data_flag=(--data "$data")

if [ "$gpt" -eq 1 ]; then
  # The GPT trainers' own defaults for lr and batch unless given (-l, -b): AdamW, cosine.
  read -r -a gpt_flags <<< "${GPT_FLAGS:-}"
  common=(--model "$model" --steps "$steps" "${data_flag[@]}" "${gpt_flags[@]}")
  # A Llama: the shape and the weights come from the folder both load (written below).
  [ "$llama" -eq 1 ] && common=(--init-from "$out/init" --steps "$steps" "${data_flag[@]}" "${gpt_flags[@]}")
  [ "$batch" != 128 ] && common+=(--batch-size "$batch")
  [ "$lr" != 0.05 ] && common+=(--lr "$lr")
else
  common=(--model "$model" --epochs "$epochs" --batch-size "$batch" --lr "$lr" --optimizer "$optimizer" "${data_flag[@]}")
  [ "$optimizer" = sgd ] && common+=(--momentum "$momentum")
fi
[ -n "$device" ] && common+=(--device "$device")
[ "$summary_only" -eq 1 ] && repeats=0
[ "$summary_only" -eq 1 ] ||
  echo "compare: $model, $ranks ranks x $threads thread(s), flags ${common[*]}${device:+, device $device};" \
       "results in $out"

# Llama: the initial weights both sides load, written once by the peer (transformers' initialization).
if [ "$llama" -eq 1 ] && [ "$summary_only" -eq 0 ] && [ ! -f "$out/init/config.json" ]; then
  "$python" "$peer" --model "$model" --save-init "$out/init" --seed "${INIT_SEED:-1}" > "$out/init.log" 2>&1 ||
    { cat "$out/init.log"; exit 1; }
fi
# The peers' variants: PyTorch eager, and for a Llama (or a GPT with COMPILE=1: torch 2.x) also
# under torch.compile (JSON torch-compiled.R.json).
variants=(eager)
{ [ "$llama" -eq 1 ] || { [ "$gpt" -eq 1 ] && [ "${COMPILE:-0}" = 1 ]; }; } && variants=(eager compiled)
tutti_ran=0
if [ "$summary_only" -eq 0 ] && [ "$torch_only" -eq 0 ] && [ ! -x "$trainer" ]; then
  echo "--- tutti: $trainer is not built (cmake --build $build --target train_fashion_mnist); skipped" >&2
  torch_only=1
fi
# A port of its own for each of torch's rendezvous, passed to every rank.
export MASTER_ADDR=127.0.0.1
port0=${MASTER_PORT:-$((29500 + RANDOM % 1000))}
for r in $(seq 1 "$repeats"); do
  export MASTER_PORT=$((port0 + r))
  if [ "$torch_only" -eq 0 ]; then
    # The peer keeps its learning rate constant: so does tutti here.
    own=(--lr-schedule constant --progress lines)
    [ "$gpt" -eq 1 ] && own=()  # the GPT trainers share their schedule (warm-up, cosine)
    [ "$llama" -eq 1 ] && own=(--sample-tokens 0)  # no sample at the end: the peer writes none
    echo "--- tutti ($r/$repeats): mpirun -np $ranks $trainer ${own[*]} ${common[*]}"
    mpirun -np "$ranks" "${mpiflags[@]}" "$trainer" "${own[@]}" "${common[@]}" \
      --json "$out/tutti.$r.json" > "$out/tutti.$r.log" 2>&1 || { cat "$out/tutti.$r.log"; exit 1; }
    grep -E "^(done|epoch)" "$out/tutti.$r.log" | tail -n 1
    tutti_ran=1
  fi
  # MFU of the peer against the same ceiling: the GEMM peak tutti's run just measured (PEAK_TFLOPS
  # when tutti does not run).
  peak=${PEAK_TFLOPS:-}
  if [ "$gpt" -eq 1 ] && [ -f "$out/tutti.$r.json" ]; then
    peak=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1])).get('peak_tflops') or '')" \
      "$out/tutti.$r.json")
  fi
  for v in "${variants[@]}"; do
    name=torch label=pytorch extra=()
    [ "$v" = compiled ] && name=torch-compiled label="pytorch compiled" extra=(--compile)
    [ "$gpt" -eq 1 ] && [ -n "$peak" ] && extra+=(--peak-tflops "$peak")
    echo "--- $label ($r/$repeats): mpirun -np $ranks $python $peer ${common[*]} ${extra[*]}"
    mpirun -np "$ranks" "${mpiflags[@]}" -x MASTER_ADDR -x MASTER_PORT \
      "$python" "$peer" "${common[@]}" "${extra[@]}" --threads "$threads" --json "$out/$name.$r.json" \
      > "$out/$name.$r.log" 2>&1 || { cat "$out/$name.$r.log"; exit 1; }
    tail -n 2 "$out/$name.$r.log" | head -n 1
    export MASTER_PORT=$((MASTER_PORT + 1000))  # a fresh port for the next rendezvous
  done
done

# The table reads every tutti.*.json and torch.*.json in $out (with --summary-only: whatever
# an earlier run left there).
[ "$summary_only" -eq 1 ] && tutti_ran=1
"$python" - "$out" "$tutti_ran" "$gpt" <<'PY'
import glob, json, os, statistics, sys
out, tutti_ran, gpt = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
def runs(name):
    rows = []
    for path in sorted(glob.glob(os.path.join(out, name + ".[0-9]*.json"))):
        with open(path) as f:
            rows.append(json.load(f))
    return rows
t = runs("tutti") if tutti_ran else []
p = runs("torch")
c = runs("torch-compiled")  # a Llama's torch.compile runs
sides = [("tutti", t), ("pytorch", p)] + ([("compiled", c)] if c else [])
def med(rows, k):
    vals = [r[k] for r in rows if r.get(k) is not None]
    return statistics.median(vals) if vals else None
def fmt(v, spec):
    return "-" if v is None else format(v, spec)
# MFU of every side against one ceiling: the median GEMM peak of tutti's runs (TFLOP/s per rank).
peak = med(t, "peak_tflops")
def mfu(rows, rate):
    fpt, tps, n = med(rows, "flops_per_token"), med(rows, rate), med(rows, "ranks")
    return fpt * tps / (n * peak * 1e12) if peak and fpt and tps and n else None
print()
print(f"medians of {max(len(r) for _, r in sides)} alternating run(s)")
print("".ljust(20) + "".join(f"{n:>14}" for n, _ in sides))
rate = "tokens_per_s" if gpt else "samples_per_s"
keys = ([("tokens_per_s", ",.0f"), ("tokens_per_s_steady", ",.0f"), ("final_val_loss", ".4f"),
         ("final_train_loss", ".4f"), ("train_s", ".1f"), ("wall_s", ".1f")] if gpt else
        [("samples_per_s", ",.0f"), ("test_accuracy", ".4f"), ("final_train_loss", ".4f"), ("train_s", ".2f"),
         ("wall_s", ".2f")])
for key, spec in keys:
    print(f"{key:20}" + "".join(f"{fmt(med(r, key), spec):>14}" for _, r in sides))
if gpt and peak:
    for key in ("tokens_per_s", "tokens_per_s_steady"):
        label = "mfu" + key[len("tokens_per_s"):]
        print(f"{label:20}" + "".join(f"{fmt(mfu(r, key), '.1%'):>14}" for _, r in sides))
    print(f"(MFU against {peak * 1e3:.1f} GFLOP/s per rank, the f32 GEMM peak tutti measured; FLOPs per token "
          + ", ".join(f"{n} {fmt(med(r, 'flops_per_token'), ',.0f')}" for n, r in sides) + ")")
ts, ps = med(t, rate), med(p, rate)
summary = {"tutti": t, "pytorch": p}
if c:
    summary["pytorch_compiled"] = c
if peak:
    summary["peak_tflops"] = peak
    summary["mfu"] = {n: mfu(r, rate) for n, r in sides}
    summary["mfu_steady"] = {n: mfu(r, "tokens_per_s_steady") for n, r in sides}
if ts and ps:
    pairs = [a[rate] / b[rate] for a, b in zip(t, p)]
    summary.update({"ratio_of_medians": ts / ps, "pair_ratios": pairs})
    print()
    for name, rows in sides[1:]:
        for key in ([rate, "tokens_per_s_steady"] if gpt else [rate]):
            a, b = med(t, key), med(rows, key)
            if a and b:
                per = ", ".join(f"{x[key] / y[key]:.2f}" for x, y in zip(t, rows) if x.get(key) and y.get(key))
                print(f"{key} ratio tutti / {name}: {a / b:.2f}x (per pair: {per})")
                summary[f"ratio_{key}_{name}"] = a / b
    if gpt:
        same = all(a.get("first_batch_crc32") == b.get("first_batch_crc32") for _, r in sides[1:] for a, b in zip(t, r))
        diff = med(t, "final_val_loss") - med(p, "final_val_loss")
        print(f"validation loss tutti - pytorch: {diff:+.4f} nats; same data order (first batch crc32): "
              f"{'yes' if same else 'NO'}")
        summary.update({"val_loss_difference": diff, "same_data_order": same})
        if c:  # a Llama: train_gpt's "config" and the peer's "fingerprint" name the same shape
            fps = {r.get("config") for r in t} | {r["fingerprint"] for _, rs in sides[1:] for r in rs if "fingerprint" in r}
            print(f"same model: {'yes' if len(fps) == 1 else 'NO'} ({', '.join(sorted(map(str, fps)))})")
            summary["same_model"] = len(fps) == 1
    else:
        summary["accuracy_difference"] = med(t, "test_accuracy") - med(p, "test_accuracy")
# Losses at equal tokens: the evaluations of the loss curves, [step, tokens, train, val], medians.
if gpt and c:
    def at(rows, step, i):
        vals = [pt[i] for r in rows for pt in r.get("loss_curve", []) if pt[0] == step]
        return statistics.median(vals) if vals else None
    steps = sorted({pt[0] for r in t for pt in r.get("loss_curve", [])})
    print("\nloss at equal tokens (medians; train: the step's global batch, val: the validation windows)")
    print(f"{'step':>6}{'tokens':>10}" + "".join(f"{n + ' train':>16}{n + ' val':>14}" for n, _ in sides))
    curve = []
    for s in steps:
        tok = next(pt[1] for r in t for pt in r.get("loss_curve", []) if pt[0] == s)
        row = [s, tok] + [at(r, s, i) for _, r in sides for i in (2, 3)]
        curve.append(row)
        print(f"{s:>6}{tok:>10,}" + "".join(f"{fmt(v, '.4f'):>16}{fmt(w, '.4f'):>14}"
                                             for v, w in zip(row[2::2], row[3::2])))
    summary["loss_at_equal_tokens"] = {"columns": ["step", "tokens"] + [f"{n} {k}" for n, _ in sides
                                                                         for k in ("train", "val")],
                                       "rows": curve}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
if not t or not p:
    print("\n(one side produced no JSON; see the logs in " + out + ")")
    sys.exit(1)
PY
