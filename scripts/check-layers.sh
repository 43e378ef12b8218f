#!/usr/bin/env bash
# The engine side knows no terminal: model/, engine/, sampler/, trace/ and the pure helpers at
# src/'s top (format, glyph, limits, notice, panics) name neither ratatui nor crossterm nor the
# tui/ and cli/ folders (docs/architecture.md). One crate keeps the build and the features simple;
# this check keeps the cut a workspace would enforce. Comment lines are not code: skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
engine=(src/model src/engine src/sampler src/trace src/format.rs src/glyph.rs src/limits.rs src/notice.rs src/panics.rs)
if hits=$(grep -rnE '\b(ratatui|crossterm)\b|crate::(tui|cli)\b' "${engine[@]}" | grep -vE '^[^:]+:[0-9]+:\s*//'); then
  printf '%s\n' "$hits"
  echo "check-layers: the engine side above reaches into the terminal side" >&2
  exit 1
fi
