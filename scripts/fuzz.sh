#!/usr/bin/env bash
# Builds and runs the fuzz targets of tutti's file readers (tests/fuzz/; docs/development.md,
# "Fuzzing"): clang's libFuzzer with AddressSanitizer and UBSan, CPU only, in build-fuzz/.
#   bash scripts/fuzz.sh                      # configure, build, write the seed corpora
#   bash scripts/fuzz.sh --ci [SECONDS]       # then run every target SECONDS (default 15) from its
#                                             # seeds; fails on any crash (scripts/test.sh runs it)
#   bash scripts/fuzz.sh --run TARGET [FLAG...]
#                                             # one target (as last built) with its corpus kept in
#                                             # build-fuzz/corpus/TARGET, more libFuzzer flags after
#                                             # it (-runs=10000000 -jobs=1 for the long runs)
# Targets: checkpoint, idx, tokens, safetensors, safetensors_folder. A crash leaves the input in
# build-fuzz/artifacts/TARGET-crash-*; replay it with build-fuzz/TARGET_fuzz FILE.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
targets=(checkpoint idx tokens safetensors safetensors_folder)
build="$PWD/build-fuzz"
mode=${1:-}

cxx=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$cxx" ]; then
  echo "fuzz: clang++ not found (apt-get install clang-14 libclang-rt-14-dev; scripts/setup.sh does)" >&2
  exit 1
fi
start=$(date +%s)
# --run takes the binaries of the last build as they are (a long run need not hold a build lock).
if [ "$mode" != --run ]; then
  generator=()
  if command -v ninja >/dev/null 2>&1 && [ ! -f "$build/Makefile" ]; then generator=(-G Ninja); fi
  cmake -S tests/fuzz -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    >/dev/null
  cmake --build "$build" -j 2
  "$build/fuzz_seeds" "$build/seeds"
  echo "fuzz: built build-fuzz and its seeds in $(($(date +%s) - start)) s"
fi

# run TARGET CORPUS [FLAG...]: the target on CORPUS (where it adds inputs) and its seeds, from
# build-fuzz/run/TARGET (where -jobs=N puts its logs, fuzz-<job>.log).
run() {
  local target=$1 corpus=$2
  shift 2
  local dict=$PWD/tests/fuzz/$target.dict
  if [ "$target" = safetensors_folder ]; then dict=$PWD/tests/fuzz/safetensors.dict; fi
  mkdir -p "$corpus" "$build/artifacts" "$build/run/$target"
  (cd "$build/run/$target" && "$build/${target}_fuzz" -max_len=8192 -timeout=10 -rss_limit_mb=2048 -dict="$dict" \
    -print_final_stats=1 -print_funcs=0 -artifact_prefix="$build/artifacts/$target-" "$@" "$corpus" \
    "$build/seeds/$target")
}

case "$mode" in
  "") ;;
  --ci)
    seconds=${2:-15}
    failed=()
    for t in "${targets[@]}"; do
      corpus=$(mktemp -d)
      if run "$t" "$corpus" -max_total_time="$seconds" > "$build/ci-$t.log" 2>&1; then
        echo "fuzz: $t: $(grep -Eo 'stat::number_of_executed_units: [0-9]+' "$build/ci-$t.log" | grep -Eo '[0-9]+$') \
executions in ${seconds} s, $(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$build/ci-$t.log" | tail -1), no crash"
      else
        echo "fuzz: $t FAILED; the end of its log ($build/ci-$t.log):" >&2
        tail -40 "$build/ci-$t.log" >&2
        failed+=("$t")
      fi
      rm -rf "$corpus"
    done
    echo "fuzz: ${#targets[@]} targets of ${seconds} s each, $(($(date +%s) - start)) s with the build"
    # The plain closing line CI reads.
    echo "fuzz: $((${#targets[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
    [ ${#failed[@]} -eq 0 ]
    ;;
  --run)
    target=${2:?"--run needs a target: ${targets[*]}"}
    shift 2
    run "$target" "$build/corpus/$target" "$@"
    ;;
  *)
    echo "usage: bash scripts/fuzz.sh [--ci [SECONDS] | --run TARGET [LIBFUZZER FLAG...]]" >&2
    exit 2
    ;;
esac
