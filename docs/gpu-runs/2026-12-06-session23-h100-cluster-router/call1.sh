#!/usr/bin/env bash
# Session 23, call 1: sync_bench; the router and the routing as one cluster launch (UNMASK_MOE_ROUTER=cluster) against two launches; moe_bench 9 dense
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$SECONDS
nvcc -O3 -arch=sm_90 -o $W/sb scripts/sync_bench.cu && timeout 90 $W/sb > $OUT/sync_bench.txt 2>&1; cat $OUT/sync_bench.txt; echo "[t=$((SECONDS-T0))]"
gpu_bandwidth $OUT/bandwidth.json
for r in split cluster; do
  UNMASK_MOE_ROUTER=$r timeout 120 $BIN check-device --model tests/fixtures/tiny-random --device cuda --json $OUT/check-$r.json > $W/check-$r.txt 2>&1; echo "check-device $r rc $?"
  grep -E "FAIL|checks," $W/check-$r.txt | head -4
done
for s in low_confidence_static low_confidence_dynamic; do
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cpu --strategy $s --max-new-tokens 32 --out $W/cpu-$s.jsonl > /dev/null 2>&1
  UNMASK_MOE_ROUTER=cluster timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --dtype f32 --strategy $s --max-new-tokens 32 --out $W/gpu-$s.jsonl > /dev/null 2>&1
  UNMASK_MOE_ROUTER=cluster timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --strategy $s --max-new-tokens 32 --out $W/gpubf-$s.jsonl > /dev/null 2>&1
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --strategy $s --max-new-tokens 32 --out $W/gpubf0-$s.jsonl > /dev/null 2>&1
  python3 - $W $s <<'PY'
import json, sys
def steps(p):
    ev = [json.loads(l) for l in open(p) if l.strip()]
    return [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]]) for e in ev if e["event"] == "step"]
w, s = sys.argv[1], sys.argv[2]
a, b = steps(f"{w}/cpu-{s}.jsonl"), steps(f"{w}/gpu-{s}.jsonl")
c, d = steps(f"{w}/gpubf-{s}.jsonl"), steps(f"{w}/gpubf0-{s}.jsonl")
print(f"tiny-sdar-moe {s}: CPU f32 vs GPU f32 cluster: {'SAME' if a == b else 'DIFF'} ({len(a)} vs {len(b)} steps); GPU bf16 cluster vs split: {'SAME' if c == d else 'DIFF'} ({len(c)} vs {len(d)})")
PY
done
echo "[t=$((SECONDS-T0))]"
for r in 1 2; do for g in split cluster; do
  UNMASK_MOE_ROUTER=$g timeout 100 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events both --warmup 1 --repeat 2 --json $OUT/bench-30b-$g-r$r.json > $OUT/bench-30b-$g-r$r.txt 2>&1 || echo "bench 30b $g FAIL"
  echo "[t=$((SECONDS-T0))] $g r$r"
done; done
grep -h "events work" $OUT/bench-30b-cluster-r*.txt
python3 - $OUT <<'PY'
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
for f in sorted(glob.glob(f"{o}/bench-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3
    for row in r["rows"]:
        print(f"{os.path.basename(f)} events {row['events']}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms ({r['floor']['denoise_bytes']/1e9:.3f} GB), {row['ms_per_forward']/fl:.3f}x, experts {r.get('moe_experts_per_layer_pass')}, tok/s {row['tokens_per_s']:.1f}")
PY
OUT=$OUT SHAPE=sdar-30b-a3b bash scripts/gpu_timeline.sh UNMASK_MOE_ROUTER=cluster 2>&1 | sed -n 2,16p
echo "[t=$((SECONDS-T0))]"
nvcc -O3 -arch=sm_90 -o $W/mb scripts/moe_bench.cu && timeout 200 $W/mb 9 dense > $OUT/moe_bench-9-dense.txt 2>&1; echo "mb rc $?"
grep -E "model splits|BEST|best" $OUT/moe_bench-9-dense.txt | tail -30
echo "[t=$((SECONDS-T0))]"
