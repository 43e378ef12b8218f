#!/usr/bin/env bash
# Session 25, call 2: main (82978d1) on whatever card comes, for issue 20's figure: SDAR-30B-A3B with this
# main's q|k|v split (5120x2048 at 4/2/8) against the old one (UNMASK_GEMV_SPLIT=5120x2048=4/2/4), alternating
# four times, events on, B=4; check-device first.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
gpu_bandwidth $W/bandwidth.json
timeout 120 $BIN check-device --model tests/fixtures/tiny-random --device cuda > $W/check.txt 2>&1; echo "check-device rc $? $(grep -E 'checks,' $W/check.txt)"
declare -A S=([main]="" [qold]="UNMASK_GEMV_SPLIT=5120x2048=4/2/4")
for r in 1 2 3 4; do for n in main qold; do
  env ${S[$n]} timeout 90 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json $W/b-$n-r$r.json > $W/b-$n-r$r.txt 2>&1 || { echo "bench $n FAIL"; tail -2 $W/b-$n-r$r.txt; }
done; done
python3 - $W <<'PY' | tee $W/final.txt
import json, glob, os, sys, collections
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(open(f"{o}/gpu.txt").read().strip(), f"bandwidth {bw/1e12:.3f} TB/s")
m = collections.defaultdict(list)
for f in sorted(glob.glob(f"{o}/b-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3; row = r["rows"][0]
    m[os.path.basename(f).split("-")[1]].append((row["ms_per_forward"], row["ms_per_forward"] / fl, fl))
for n, v in m.items(): print(n, " ".join(f"{a:.4f}" for a, _, _ in v), "ms/forward;", " ".join(f"{b:.3f}x" for _, b, _ in v), f"floor {v[0][2]:.3f} ms")
PY
cp $W/final.txt $W/check.txt $OUT/; tar czf $OUT/raw.tgz -C $W bandwidth.json gpu.txt $(cd $W && ls b-*.json b-*.txt)
