#!/usr/bin/env bash
# Session 22, call 2: the grouped MoE kernels on a grid of resident blocks (moe_items) against a block an item.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O3 -arch=sm_90 -o $W/mb scripts/moe_bench.cu && timeout 60 $W/mb check | grep CHECK
gpu_bandwidth $OUT/bandwidth.json
for g in resident slots; do
  UNMASK_MOE_GRID=$g timeout 150 $BIN check-device --model tests/fixtures/tiny-random --device cuda --json $OUT/check-$g.json > $W/check-$g.txt 2>&1; echo "check-device $g rc $?"
  grep -E "FAIL|checks," $W/check-$g.txt | head -4
done
for s in low_confidence_static low_confidence_dynamic; do
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cpu --strategy $s --max-new-tokens 32 --out $W/cpu-$s.jsonl > /dev/null 2>&1
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --dtype f32 --strategy $s --max-new-tokens 32 --out $W/gpu-$s.jsonl > /dev/null 2>&1
  python3 - $W/cpu-$s.jsonl $W/gpu-$s.jsonl $s <<'PY'
import json, sys
def steps(p):
    ev = [json.loads(l) for l in open(p) if l.strip()]
    return [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]]) for e in ev if e["event"] == "step"]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
print(f"tiny-sdar-moe {sys.argv[3]}: CPU f32 vs GPU f32: {'SAME' if a == b else 'DIFF'} ({len(a)} vs {len(b)} steps)")
PY
done
for r in 1 2; do for g in resident slots; do
  UNMASK_MOE_GRID=$g timeout 100 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events both --warmup 1 --repeat 2 --json $OUT/bench-30b-$g-r$r.json > $OUT/bench-30b-$g-r$r.txt 2>&1 || echo "bench 30b $g FAIL"
done; done
grep -h "events work" $OUT/bench-30b-resident-r*.txt
python3 - $OUT <<'PY'
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
for f in sorted(glob.glob(f"{o}/bench-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3
    for row in r["rows"]:
        print(f"{os.path.basename(f)} events {row['events']}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms ({r['floor']['denoise_bytes']/1e9:.3f} GB), {row['ms_per_forward']/fl:.3f}x, experts {r.get('moe_experts_per_layer_pass')}, tok/s {row['tokens_per_s']:.1f}")
PY
OUT=$OUT SHAPE=sdar-30b-a3b bash scripts/gpu_timeline.sh 2>&1 | sed -n 2,14p
timeout 100 $W/mb 9 > $OUT/moe_bench-9.txt 2>&1; grep -E "GRID|model splits" $OUT/moe_bench-9.txt
