#!/usr/bin/env bash
# Checks what a reviewer should not have to: formatting of every tracked C++/CUDA source
# (clang-format with .clang-format), every tracked shell script (shellcheck: *.sh, *.sbatch),
# and the subjects of the commits since the rule was set (at most 72 characters).
# scripts/test.sh runs it first.
# Fix formatting with: clang-format -i $(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "lint: not a git checkout; nothing to check" >&2
  exit 0
fi
status=0

mapfile -t cxx < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if clang-format --dry-run -Werror "${cxx[@]}" 2> /tmp/tutti-lint-format.$$; then
  echo "lint: clang-format: ${#cxx[@]} files formatted"
else
  grep -E '^[^ ].*: error:' /tmp/tutti-lint-format.$$ | cut -d: -f1 | sort -u | sed 's/^/  needs clang-format -i: /' >&2
  echo "lint: clang-format: the files above differ from .clang-format's style" >&2
  status=1
fi
rm -f /tmp/tutti-lint-format.$$

mapfile -t sh < <(git ls-files '*.sh' '*.sbatch')
if shellcheck -f gcc "${sh[@]}"; then
  echo "lint: shellcheck: ${#sh[@]} scripts clean"
else
  echo "lint: shellcheck found the problems above" >&2
  status=1
fi

# Commit subjects: at most 72 characters from the commit that set the rule on (earlier history
# is as it was). A shallow clone without that commit checks nothing.
rule_from=42b8ad8
if git cat-file -e "$rule_from^{commit}" 2>/dev/null; then
  long=$(git log --no-merges --format='%h %s' "$rule_from..HEAD" | awk 'length($0) - length($1) - 1 > 72')
  if [ -n "$long" ]; then
    echo "lint: commit subjects over 72 characters (put the detail in the body):" >&2
    while read -r line; do echo "  $line" >&2; done <<< "$long"
    status=1
  else
    echo "lint: commit subjects: at most 72 characters since $rule_from"
  fi
fi
exit $status
