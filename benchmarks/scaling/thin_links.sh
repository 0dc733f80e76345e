#!/usr/bin/env bash
# Training over thin links on the emulated cluster (scripts/cluster.sh; docs/thin-links.md,
# "Benchmarks on the emulated cluster"): examples/train_gpt, a 10.8 M-parameter GPT (6 layers,
# 384 wide, context 64, byte vocabulary) on this repository's docs, on 2 and 4 emulated nodes with
# links shaped to 10 Gbit/s, 1 Gbit/s and 100 Mbit/s, in each synchronization mode:
#   DDP flat and hierarchical (N nodes x 2 ranks, side by side: the hierarchical allreduce needs
#   ranks to share a node; --hier-ranks-per-node, 0: none), DDP flat and DiLoCo (N nodes x 1
#   rank) with H in --periods, each outer dtype of --dtypes, streaming off and on (--fragments;
#   0: off), --diloco-flags added to their command (e.g. "--outer-lr 1 --outer-momentum 0") and
#   --tag T to their names (diloco-H50-int8-T: rows of other --diloco-flags in the same RESULTS);
#   DDP with PowerSGD (N nodes x 1 rank, --allreduce powersgd:R) for each R of --powersgd (none by default).
#   --ddp-tag T names the DDP flat row ddp-flat-T (e.g. another --lr; compared with ddp-flat).
# Every row trains the same global batch for the same steps, so validation losses compare at equal
# tokens. Writes runs/<link>_<N>x<L>_<mode>.{json,txt}, results.csv, results.md and
# loss_vs_time.png (matplotlib permitting) into RESULTS (outside the repository except docs/bench/).
# A trainer without --sync (DiLoCo not built yet) runs the DDP rows only, one without
# --streaming no streaming rows, and says so.
# --local: no cluster and no root; the rows run on this machine (mpirun --oversubscribe, DiLoCo's
# nodes faked with --ranks-per-node), link "local": validation losses only, which do not depend
# on the link (docs/thin-links.md, "Loss against run length, and the learning rates").
# --lr and --warmup-steps change the inner AdamW's (1e-3, 5) for every row of the call.
# --corpus-commit REV takes the corpus's files as they were at git revision REV (the docs
# change; same corpus, comparable losses).
# Needs root (namespaces, except --local) and a build (BUILD, default build/).
#   bash benchmarks/scaling/thin_links.sh --quick RESULTS       # 2 nodes at 1 Gbit/s, 20 steps: minutes
#   bash benchmarks/scaling/thin_links.sh RESULTS               # everything: hours
#   bash benchmarks/scaling/thin_links.sh --nodes 4 --speeds 1gbit --periods 50 --dtypes int8 RESULTS
#   bash benchmarks/scaling/thin_links.sh --local --nodes 4 --steps 1000 --periods 50 --dtypes int8 RESULTS
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
nodes="2 4" speeds="10gbit 1gbit 100mbit" periods="10 50 100" dtypes="f32 bf16 int8 int4"
fragments=4 steps=200 eval_every=25 batch=8 quick=0 out="" hier_per_node=2 diloco_flags="" tag=""
onemachine=0 lr=1e-3 warmup=5 corpus_rev="" ddp_tag="" powersgd=""
# --quick sets the smallest subset; options given with it still apply.
for a in "$@"; do
  if [ "$a" = --quick ]; then
    quick=1 nodes=2 speeds=1gbit periods=10 dtypes=int8 steps=20 eval_every=10
  fi
done
while [ $# -gt 0 ]; do
  case $1 in
    --quick) ;;
    --nodes) nodes=$2; shift ;;
    --speeds) speeds=$2; shift ;;
    --periods) periods=$2; shift ;;
    --dtypes) dtypes=$2; shift ;;
    --fragments) fragments=$2; shift ;;
    --steps) steps=$2; shift ;;
    --eval-every) eval_every=$2; shift ;;
    --batch) batch=$2; shift ;;
    --diloco-flags) diloco_flags=$2; shift ;;
    --tag) tag=$2; shift ;;
    --powersgd) powersgd=$2; shift ;;
    --ddp-tag) ddp_tag=$2; shift ;;
    --hier-ranks-per-node) hier_per_node=$2; shift ;;
    --local) onemachine=1 ;;
    --lr) lr=$2; shift ;;
    --warmup-steps) warmup=$2; shift ;;
    --corpus-commit) corpus_rev=$2; shift ;;
    -h|--help) usage 0 ;;
    -*) echo "thin_links.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$out" ] || usage; out=$1 ;;
  esac
  shift
done
[ -n "$out" ] || { echo "thin_links.sh: give a results folder" >&2; usage; }
out=$(realpath -m "$out")
case "$out/" in
  "$repo/docs/bench/"*) ;;
  "$repo/"*) echo "thin_links.sh: write results outside the repository, or under docs/bench/ ($out)" >&2; exit 2 ;;
esac
mkdir -p "$out/runs" || exit 1
build=$(realpath -m "${BUILD:-$repo/build}")
trainer=$build/examples/train_gpt
[ -x "$trainer" ] || { echo "thin_links.sh: no $trainer (scripts/build.sh, or BUILD=...)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
# The results and the build, where under /tmp, are carried into the nodes (their /tmp is their own).
export TUTTI_CLUSTER_KEEP="$out:$build${TUTTI_CLUSTER_KEEP:+:$TUTTI_CLUSTER_KEEP}"

help=$("$trainer" --help 2>&1)
diloco=1 streaming=1
if ! grep -q -- '--sync' <<< "$help"; then
  diloco=0
  echo "thin_links.sh: $trainer has no --sync (DiLoCo not built yet): DDP rows only"
elif [ "$fragments" -gt 0 ] && ! grep -q -- '--streaming' <<< "$help"; then
  streaming=0
  echo "thin_links.sh: $trainer has no --streaming (streaming DiLoCo not built yet): no streaming rows"
fi

# The data: this repository's docs, as tests/examples/train_gpt_test.py's corpus.
corpus_files=(README.md docs/architecture.md docs/user-guide.md docs/development.md)
if [ -n "$corpus_rev" ]; then
  for c in "${corpus_files[@]}"; do git -C "$repo" show "$corpus_rev:$c" || exit 1; done > "$out/corpus.txt"
else
  (cd "$repo" && cat "${corpus_files[@]}") > "$out/corpus.txt" || exit 1
fi
model=(--model gpt-tiny --layers 6 --heads 6 --width 384 --context 64 --seq-len 64 --data "$out/corpus.txt"
       --batch-size "$batch" --steps "$steps" --lr "$lr" --warmup-steps "$warmup" --eval-every "$eval_every"
       --val-tokens 4096 --sample-tokens 0 --seed 1 --quiet)
{
  echo "# $(date -u +%FT%TZ) on $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $(git -C "$repo" rev-parse --short HEAD 2>/dev/null) $trainer ${model[*]}"
  echo "# corpus: ${corpus_files[*]} at ${corpus_rev:-the working tree}"
  echo "# DiLoCo rows: $([ "$diloco" = 1 ] && echo "yes ($diloco_flags)" || echo "no (trainer without --sync)")"
  echo "# streaming rows: $([ "$diloco" = 1 ] && [ "$streaming" = 1 ] && [ "$fragments" -gt 0 ] && echo yes || echo no)"
} > "$out/machine.txt"

name=thin$$
cluster() { bash "$repo/scripts/cluster.sh" "$@"; }
[ "$onemachine" = 1 ] && speeds=local
[ "$onemachine" = 1 ] || trap 'cluster down --name $name >/dev/null 2>&1' EXIT
# "N L" -> mpirun's --host list: L ranks on each of nodes 0..N-1.
hosts() { local h="" i; for ((i = 0; i < $1; i++)); do h="$h${h:+,}node$i:$2"; done; echo "$h"; }

# run LINK N L MODE [train_gpt flags...]: one row; skipped when its JSON is already there.
run() {
  local speed=$1 n=$2 l=$3 mode=$4; shift 4
  local f="$out/runs/${speed}_${n}x${l}_${mode}" launch
  if [ -s "$f.json" ]; then echo "  $mode: have $f.json"; return; fi
  if [ "$onemachine" = 1 ]; then
    # One machine: the nodes are faked (DiLoCo's --ranks-per-node; DDP's layout does not matter).
    launch=(mpirun --oversubscribe -np $((n * l)))
    [ "$mode" = "${mode#diloco}" ] || set -- "$@" --ranks-per-node "$l"
  else
    launch=(cluster exec --name "$name" -- mpirun --host "$(hosts "$n" "$l")" -np $((n * l)))
  fi
  "${launch[@]}" "$trainer" "${model[@]}" "$@" --json "$f.json" > "$f.txt" 2>&1 ||
    { echo "  FAILED: $mode (see $f.txt)"; rm -f "$f.json"; return; }
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("  %-28s %8.0f tokens/s  val %.4f  %.0f s" % (
    sys.argv[2], j["tokens_per_s"], j["final_val_loss"], j["wall_s"]))' "$f.json" "$mode"
}

for speed in $speeds; do
  for n in $nodes; do
    if [ "$onemachine" = 0 ]; then
      cluster down --name "$name" >/dev/null 2>&1
      cluster up --name "$name" --nodes "$n" --slots $((hier_per_node > 1 ? hier_per_node : 1)) \
        --bandwidth "$speed" >/dev/null || exit 1
    fi
    echo "# $speed, $n nodes"
    # Flat and hierarchical need ranks that share a node (and a batch that they divide).
    if [ "$hier_per_node" = 0 ]; then
      :
    elif [ $((batch % (n * hier_per_node))) = 0 ]; then
      for a in flat hierarchical; do
        run "$speed" "$n" "$hier_per_node" "ddp-$a" --allreduce "$a"
      done
    else
      echo "  ddp flat/hierarchical on ${n}x$hier_per_node skipped: --batch $batch is not a multiple of $((n * hier_per_node))"
    fi
    if [ "$quick" = 1 ] && [ "$diloco" = 0 ]; then continue; fi
    run "$speed" "$n" 1 "ddp-flat${ddp_tag:+-$ddp_tag}" --allreduce flat
    for r in $powersgd; do
      run "$speed" "$n" 1 "ddp-powersgd-r$r" --allreduce "powersgd:$r"
    done
    [ "$diloco" = 1 ] || continue
    for h in $periods; do
      for d in $dtypes; do
        # shellcheck disable=SC2086 # --diloco-flags: words
        run "$speed" "$n" 1 "diloco-H$h-$d${tag:+-$tag}" --sync "diloco:$h" --outer-dtype "$d" $diloco_flags
        if [ "$fragments" -gt 0 ] && [ "$streaming" = 1 ]; then
          # shellcheck disable=SC2086
          run "$speed" "$n" 1 "diloco-H$h-$d-s$fragments${tag:+-$tag}" --sync "diloco:$h" --outer-dtype "$d" \
            --streaming "$fragments" $diloco_flags
        fi
      done
    done
  done
done
[ "$onemachine" = 1 ] || cluster down --name "$name" >/dev/null 2>&1
echo "# $(cut -d' ' -f1-3 /proc/loadavg) load average at the end" >> "$out/machine.txt"
# The report: matplotlib is Debian's (python3-matplotlib), for /usr/bin/python3.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" "$here/thin_links_report.py" "$out"
