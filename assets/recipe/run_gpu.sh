#!/usr/bin/env bash
# The one command for a GPU host (no network needed; assets/recipe/work/ must be copied along):
#
#     bash assets/recipe/run_gpu.sh            # from the repo root
#
# Trains the tiny SDAR model for $MINUTES (default 7) minutes of wall clock, exports it,
# evaluates it and leaves exactly 8 files flat in $OUT:
#   config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json
#   eval.json samples.json train.log
# The full export folder (those plus train_summary.json) is written to $EXPORT_DIR
# (default /tmp/unmask-recipe/tiny-sdar), outside $OUT, so that $OUT never holds more than the
# 8 files that come back. Files are copied into $OUT as soon as they exist, and the log is
# tee'd there, so a timeout still returns what was done. Export comes before evaluation.
#
# Knobs (environment): MINUTES=7  COMPILE=0|1  DROPOUT=0.1  PYTHON=python3  EXPORT_DIR=...
#   TRAIN_ARGS / EVAL_ARGS: extra flags, word-split (e.g. a CPU dry run:
#   MINUTES=0.3 TRAIN_ARGS="--preset smoke --seq-len 128 --batch 8" EVAL_ARGS="--max-windows 8")
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
R=assets/recipe
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/unmask-recipe/out}"
MINUTES="${MINUTES:-7}"
DROPOUT="${DROPOUT:-0.1}"
PY="${PYTHON:-python3}"
EXPORT_DIR="${EXPORT_DIR:-/tmp/unmask-recipe/tiny-sdar}"
mkdir -p "$OUT" "$EXPORT_DIR"
LOG="$OUT/train.log"
: >"$LOG"
T0=$(date +%s)

# shellcheck disable=SC2206
EXTRA=(${TRAIN_ARGS:-})
if [ "${COMPILE:-0}" = "1" ]; then EXTRA+=(--compile); fi
# shellcheck disable=SC2206
EVAL_EXTRA=(${EVAL_ARGS:-})

{
  echo "== unmask tiny-sdar recipe, $(date -u +%FT%TZ), minutes=$MINUTES dropout=$DROPOUT compile=${COMPILE:-0}"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  "$PY" - <<'EOF'
import sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory/2**30:.0f} GiB", p.multi_processor_count, "SMs")
EOF
  ls -l "$R/work"
} 2>&1 | tee -a "$LOG"

test -f "$R/work/train.npy" || { echo "missing $R/work (run prepare.py where there is network, carry work/)" | tee -a "$LOG"; exit 1; }

# ---- train + export (fatal on failure)
"$PY" "$R/train.py" --data "$R/work" --out "$EXPORT_DIR" --minutes "$MINUTES" \
  --dropout "$DROPOUT" ${EXTRA[@]+"${EXTRA[@]}"} 2>&1 | tee -a "$LOG"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
  cp "$EXPORT_DIR/$f" "$OUT/$f"
done
echo "== exported after $(( $(date +%s) - T0 ))s: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"

# ---- evaluation (optional: a failure here keeps the export)
set +e
timeout "${EVAL_TIMEOUT:-90}" "$PY" "$R/evaluate.py" --model "$EXPORT_DIR" --data "$R/work" \
  ${EVAL_EXTRA[@]+"${EVAL_EXTRA[@]}"} 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = "0" ] || echo "== evaluate.py failed (rc=$rc); the model is exported anyway" | tee -a "$LOG"
for f in eval.json samples.json; do
  if [ -f "$EXPORT_DIR/$f" ]; then cp "$EXPORT_DIR/$f" "$OUT/$f"; fi
done
if [ -f "$EXPORT_DIR/train_summary.json" ]; then
  echo "== train_summary.json (not returned as a file):" | tee -a "$LOG"
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); d.pop('history',None); print(json.dumps(d))" \
    "$EXPORT_DIR/train_summary.json" 2>&1 | tee -a "$LOG" || true
fi
# ---- transformers parity on the trained weights (informative; only if time is left)
if [ $(( $(date +%s) - T0 )) -lt 500 ]; then
  timeout 45 "$PY" "$R/check_hf.py" --model "$EXPORT_DIR" --data "$R/work" 2>&1 \
    | grep -v "Loading weights" | tee -a "$LOG" || echo "== check_hf.py skipped/failed" | tee -a "$LOG"
fi
echo "== done in $(( $(date +%s) - T0 ))s; \$OUT holds: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"
