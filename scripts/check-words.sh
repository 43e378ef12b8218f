#!/usr/bin/env bash
# The repository speaks of the product only. Fails, listing each line, where a tracked text file
# names a work period or an issue number, dates a trial, or holds a path of one particular machine.
# History (what was tried, when) lives in git; docs hold current behaviour and current figures.
set -euo pipefail
cd "$(dirname "$0")/.."
# Patterns are written so that this file does not match itself: [k] and [0-9] break the words.
patterns=(
  '\b[Ss]ession ?#?[0-9]+'                         # a work period's number
  '\b[Ii]ssues? #?[0-9]+'                          # an issue's number
  '(^|[ "=(:`'"'"'])/wor[k]/'                      # a path of this project's dev machines
  '\b20[0-9]{2}-[01][0-9]-[0-3][0-9]'              # a date: trials are dated in git, not in files
  '\brun [0-9]+\b.*perf\.md|perf\.md, run [0-9]'   # a trial cited by its number in docs/perf.md
)
files=$(git ls-files -- '*.md' '*.rs' '*.sh' '*.py' '*.cu' '*.cuh' '*.c' '*.toml' '.ci/*' \
  | grep -v -e '^Cargo.lock$' -e '^tests/fixtures/qwen3-tokenizer/')
status=0
for p in "${patterns[@]}"; do
  if hits=$(printf '%s\n' "$files" | xargs grep -nE -- "$p" 2>/dev/null); then
    printf '%s\n' "$hits"
    status=1
  fi
done
# File and folder names too (a run folder named for its date or work period).
if names=$(git ls-files | grep -E '[Ss]ession-?[0-9]|20[0-9]{2}-[01][0-9]-[0-3][0-9]'); then
  printf '%s\n' "$names"
  status=1
fi
if [[ $status != 0 ]]; then
  echo "check-words: the lines above name a work period, an issue, a date or a machine path" >&2
fi
exit $status
