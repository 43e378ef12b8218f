#!/usr/bin/env bash
# The kernel benches on a GPU host, in one call: nvcc only (no unmask binary, no cargo needed).
# How the gemv and grouped-expert splits are re-tuned (docs/tuning.md).
#
#   bash scripts/gpu_kernels.sh                      # every bench at every dense shape
#   SHAPES="4b" BENCHES="gemv" bash scripts/gpu_kernels.sh
#
# BENCHES: packed (scripts/packed_bench.cu: the gemv reading W re-laid out in the order its warps
# read it, against the checkpoint's rows, per projection, in the chain, and its splits swept),
# gemv (scripts/gemv_bench.cu: the kernel against cuBLAS, the streamed layer's chain, a split sweep),
# moe (scripts/moe_bench.cu: the grouped expert products at the SDAR-30B-A3B shape; no shape;
# MOE_ARGS="9 dense" adds the router, q|k|v and o splits swept in rows and packed).
# SHAPES: 1.7b 4b 8b (GEMV_SHAPE). Writes $OUT/kernels.log and one file a bench, every shape's
# output in it under a `=== shape S` line (5 files). Each bench run is limited to 240 s; if the
# whole would pass 600 s, split it (BENCHES="packed moe", then "gemv").
# Exit 1 if any bench fails to build, run or check.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/unmask-gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/kernels.log") 2>&1
SHAPES=${SHAPES:-1.7b 4b 8b}
BENCHES=${BENCHES:-packed gemv moe}
W=$(mktemp -d)
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
[[ -n $NVCC ]] || { echo "nvcc not found"; exit 1; }
T0=$(date +%s)
FAILED=()
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader || true
for b in $BENCHES; do
  echo; echo "=== [$(( $(date +%s) - T0 )) s] build ${b}_bench"
  libs=(); [[ $b == gemv ]] && libs=(-lcublas)
  if ! "$NVCC" -O3 -arch=sm_90 -o "$W/$b" "scripts/${b}_bench.cu" "${libs[@]}"; then FAILED+=("$b build"); continue; fi
  shapes=$SHAPES; [[ $b == moe ]] && shapes=30b-a3b
  for s in $shapes; do
    echo; echo "=== [$(( $(date +%s) - T0 )) s] ${b}_bench, shape $s"
    f="$OUT/${b}_bench.txt" one="$W/${b}_$s.txt"
    args=(); [[ $b == moe ]] && args=(${MOE_ARGS:-})
    GEMV_SHAPE=$s timeout 240 "$W/$b" "${args[@]}" > "$one" 2>&1
    rc=$?
    { echo "=== shape $s (rc $rc)"; cat "$one"; } >> "$f"
    if ((rc == 0)); then
      grep -E "chain|best|final|done|FAIL|TB/s \| packed" "$one" | head -40
    else
      FAILED+=("$b $s (rc $rc)"); tail -15 "$one"
    fi
  done
done
echo; echo "=== [$(( $(date +%s) - T0 )) s] summary"
if ((${#FAILED[@]})); then printf 'FAILED: %s\n' "${FAILED[@]}"; exit 1; fi
echo "all benches ran and checked"
