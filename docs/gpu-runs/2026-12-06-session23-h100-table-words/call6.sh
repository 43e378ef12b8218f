#!/usr/bin/env bash
# Session 23, call 6: the table words at once in gate|up only (uponly), against main (base) and both kernels (tab)
set -uo pipefail
source scripts/gpu_common.sh
W=$(mktemp -d)
unpack_unmask $W/new > /dev/null || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $W/tab
cp .gpu/base-kernels/* $W/tab/; cp kernels/gemv.cu $W/tab/
gpu_bandwidth $W/bandwidth.json
for r in 1 2; do for g in base uponly tab; do
  d=$W/$g; [[ $g == base ]] && d=$PWD/.gpu/base-kernels; [[ $g == uponly ]] && d=$PWD/.gpu/uponly
  UNMASK_KERNELS=$d timeout 100 $W/new bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json $W/bench-30b-$g-r$r.json > /dev/null 2>&1 || echo "bench $g FAIL"
done; done
python3 - $W <<'PY' | tee $OUT/bench.txt
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
for f in sorted(glob.glob(f"{o}/bench-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3
    for row in r["rows"]:
        print(f"{os.path.basename(f)} events {row['events']}: {row['ms_per_forward']:.4f} ms/forward, {row['ms_per_forward']/fl:.3f}x")
PY
UNMASK_KERNELS=$PWD/.gpu/uponly timeout 120 $W/new check-device --model tests/fixtures/tiny-random --device cuda --json $W/check.json > $W/check.txt 2>&1; echo "check-device uponly rc $?"
grep -E "FAIL|checks," $W/check.txt | head -3
