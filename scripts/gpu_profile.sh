#!/usr/bin/env bash
# Per-kernel GPU time of a decode, by Nsight Compute (ncu), on the GPU host.
#
#   bash scripts/gpu_profile.sh [ENV=VALUE ...]     # e.g. UNMASK_FUSED=0
#
# Profiles LAUNCHES (default 900, about three forwards) consecutive kernels of a SHAPE (default sdar-1.7b)
# bench decode (a prompt of PROMPT tokens, default 64) after skipping SKIP (default 4000: weight initialisation and prefill), graph
# nodes one by one, with the clocks left alone (--clock-control none), and prints the time per
# kernel name, summed, with its share. FILTER (a regex, e.g. `unmask_`) profiles only kernels whose
# names match, and SKIP then counts only those. Needs .gpu/unmask.gz (scripts/build-cuda.sh) and ncu.
# Writes $OUT/ncu-<tag>.csv (raw) and prints the table.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
OUT=${OUT:-/tmp/unmask-gpu-out}
mkdir -p "$OUT"
BIN=$(mktemp -d)/unmask
unpack_unmask "$BIN" || exit 1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[[ -n $NCU ]] || { echo "ncu not found"; exit 1; }
tag=${*:-default}; tag=${tag//[^A-Za-z0-9]/_}
csv=$OUT/ncu-$tag.csv
env "$@" timeout 300 "$NCU" --clock-control none --metrics gpu__time_duration.sum ${FILTER:+--kernel-name regex:$FILTER} \
  --launch-skip "${SKIP:-4000}" --launch-count "${LAUNCHES:-900}" --csv --print-units base \
  "$BIN" bench --random-init "${SHAPE:-sdar-1.7b}" --device cuda --prompt-len "${PROMPT:-64}" --max-new-tokens 64 \
  --strategy low_confidence_static --events off --warmup 0 --repeat 1 > "$csv" 2> "$OUT/ncu-$tag.err"
echo "ncu rc=$? ($csv)"
python3 - "$csv" <<'EOF'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: print("no ncu rows"); sys.exit(0)
h = rows[0]; ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
tot, cnt = collections.Counter(), collections.Counter()
for r in rows[1:]:
    if r[mi] != "gpu__time_duration.sum": continue
    name = r[ki].split("(")[0][:70]
    tot[name] += float(r[vi].replace(",", "")); cnt[name] += 1
all_ns = sum(tot.values())
print(f"{sum(cnt.values())} kernels, {all_ns/1e3:.1f} us of kernel time")
print("| kernel | launches | total us | mean us | share |")
print("|---|---:|---:|---:|---:|")
for k, v in tot.most_common(25):
    print(f"| {k} | {cnt[k]} | {v/1e3:.1f} | {v/cnt[k]/1e3:.2f} | {100*v/all_ns:.1f} % |")
EOF
