#!/usr/bin/env bash
# Session 23, call 8: the final form (gate|up's table words at once, through L1) as built (new) against main's kernels (base)
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d)
unpack_unmask $W/new > /dev/null || exit 1
printf '#!/bin/sh\nUNMASK_KERNELS=%s/.gpu/base-kernels exec %s/new "$@"\n' $PWD $W > $W/base; chmod +x $W/base
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O3 -arch=sm_90 -o $W/mb scripts/moe_bench.cu && timeout 60 $W/mb check | grep CHECK
gpu_bandwidth $W/bandwidth.json
timeout 120 $W/new check-device --model tests/fixtures/tiny-random --device cuda --json $W/check.json > $W/check.txt 2>&1; echo "check-device new rc $?"
grep -E "FAIL|checks," $W/check.txt | head -4
for s in low_confidence_static low_confidence_dynamic; do
  timeout 60 $W/new trace --model tests/fixtures/tiny-sdar-moe --device cpu --strategy $s --max-new-tokens 32 --out $W/cpu-$s.jsonl > /dev/null 2>&1
  timeout 60 $W/new trace --model tests/fixtures/tiny-sdar-moe --device cuda --dtype f32 --strategy $s --max-new-tokens 32 --out $W/gpu-$s.jsonl > /dev/null 2>&1
  timeout 60 $W/new trace --model tests/fixtures/tiny-sdar-moe --device cuda --strategy $s --max-new-tokens 32 --out $W/new-$s.jsonl > /dev/null 2>&1
  timeout 60 $W/base trace --model tests/fixtures/tiny-sdar-moe --device cuda --strategy $s --max-new-tokens 32 --out $W/base-$s.jsonl > /dev/null 2>&1
  python3 - $W $s <<'PY'
import json, sys
def steps(p):
    ev = [json.loads(l) for l in open(p) if l.strip()]
    return [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]]) for e in ev if e["event"] == "step"]
w, s = sys.argv[1], sys.argv[2]
def cmp(a, b): a, b = steps(f"{w}/{a}-{s}.jsonl"), steps(f"{w}/{b}-{s}.jsonl"); return f"{'SAME' if a == b and a else 'DIFF'} ({len(a)} vs {len(b)} steps)"
print(f"{s}: tiny-sdar-moe CPU f32 vs GPU f32 new {cmp('cpu', 'gpu')}; GPU bf16 new vs base {cmp('new', 'base')}")
PY
done
for r in 1 2 3; do for g in base new; do
  timeout 100 $W/$g bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events both --warmup 1 --repeat 2 --json $W/bench-30b-$g-r$r.json > $W/bench-30b-$g-r$r.txt 2>&1 || echo "bench 30b $g FAIL"
done; done
grep -h "events work" $W/bench-30b-new-r*.txt
python3 - $W <<'PY' | tee $OUT/bench.txt
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
for f in sorted(glob.glob(f"{o}/bench-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3
    for row in r["rows"]:
        print(f"{os.path.basename(f)} events {row['events']}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms ({r['floor']['denoise_bytes']/1e9:.3f} GB), {row['ms_per_forward']/fl:.3f}x, experts {r.get('moe_experts_per_layer_pass')}, tok/s {row['tokens_per_s']:.1f}")
PY
OUT=$W SHAPE=sdar-30b-a3b bash scripts/gpu_timeline.sh > /dev/null 2>&1; cp $W/timeline-sdar_30b_a3b.md $OUT/timeline-new.md; sed -n 3,14p $OUT/timeline-new.md
cp $W/check.txt $OUT/
tar czf $OUT/raw.tgz -C $W bandwidth.json check.json $(cd $W && ls bench-*)
