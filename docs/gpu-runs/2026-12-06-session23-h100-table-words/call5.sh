#!/usr/bin/env bash
# Session 23, call 5: which of call 4's two kernel changes costs: the table words (gemv.cu) or attention's slot (fused.cu), each alone on main's kernels
set -uo pipefail
source scripts/gpu_common.sh
W=$(mktemp -d)
unpack_unmask $W/new > /dev/null || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $W/tab $W/att
cp .gpu/base-kernels/* $W/tab/; cp kernels/gemv.cu $W/tab/
cp .gpu/base-kernels/* $W/att/; cp kernels/fused.cu $W/att/
gpu_bandwidth $W/bandwidth.json
for r in 1 2; do for g in base tab att; do
  d=$W/$g; [[ $g == base ]] && d=$PWD/.gpu/base-kernels
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
