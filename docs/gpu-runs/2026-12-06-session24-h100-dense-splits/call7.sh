#!/usr/bin/env bash
# Session 24, call 7: call 6's comparison again on whichever card comes (an H200 was hoped for): the 30B-A3B's
# q|k|v at 8 steps a batch as built against main's 4 (UNMASK_GEMV_SPLIT=5120x2048=4/2/4), alternating.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gpu_bandwidth $W/bandwidth.json
for r in 1 2 3; do for n in main new; do
  sp=""; [[ $n == main ]] && sp="5120x2048=4/2/4"
  UNMASK_GEMV_SPLIT="$sp" timeout 90 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events both --warmup 1 --repeat 2 --json $W/b-$n-r$r.json > $W/b-$n-r$r.txt 2>&1 || echo "bench $n FAIL"
done; done
python3 - $W <<'PY' | tee $W/final.txt
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s; main = UNMASK_GEMV_SPLIT=5120x2048=4/2/4, new = as built (4/2/8)")
for f in sorted(glob.glob(f"{o}/b-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3
    for row in r["rows"]:
        ev = (row["event_build_ms"] + row["event_write_ms"]) / row["decode_ms"] * 100
        print(f"{os.path.basename(f)} events {row['events']}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms, {row['ms_per_forward']/fl:.3f}x, {row['tokens_per_s']:.1f} tok/s, events {ev:.2f} %, experts {r['moe_experts_per_layer_pass']:.2f}")
PY
cp $W/final.txt $OUT/; tar czf $OUT/raw.tgz -C $W bandwidth.json $(cd $W && ls b-*.json)
