#!/usr/bin/env bash
# Session 24, call 1 (prepared in session 23): the expert-hint trial (git cherry-pick 3bbfb47, then scripts/build-cuda.sh):
# UNMASK_MOE_HINT=0/4/8 alternating on the 30B-A3B; check-device and the MoE fixture's decodes under 8; tiny-sdar-chat on the GPU
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for s in low_confidence_static low_confidence_dynamic; do
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-chat --device cuda --strategy $s --max-new-tokens 32 --out $W/chat-$s.jsonl 2>&1 | tail -2; echo "tiny-sdar-chat cuda $s rc ${PIPESTATUS[0]}: $(grep -c '"step"' $W/chat-$s.jsonl) steps"
done
nvcc -O3 -arch=sm_90 -o $W/mb scripts/moe_bench.cu && timeout 60 $W/mb check | grep CHECK
gpu_bandwidth $W/bandwidth.json
UNMASK_MOE_HINT=8 timeout 120 $BIN check-device --model tests/fixtures/tiny-random --device cuda --json $W/check.json > $W/check.txt 2>&1; echo "check-device hint 8 rc $?"
grep -E "FAIL|checks," $W/check.txt | head -4
for s in low_confidence_static low_confidence_dynamic; do
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cpu --strategy $s --max-new-tokens 32 --out $W/cpu-$s.jsonl > /dev/null 2>&1
  UNMASK_MOE_HINT=8 timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --dtype f32 --strategy $s --max-new-tokens 32 --out $W/gpu-$s.jsonl > /dev/null 2>&1
  UNMASK_MOE_HINT=8 timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --strategy $s --max-new-tokens 32 --out $W/h8-$s.jsonl > /dev/null 2>&1
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --strategy $s --max-new-tokens 32 --out $W/h0-$s.jsonl > /dev/null 2>&1
  python3 - $W $s <<'PY'
import json, sys
def steps(p):
    ev = [json.loads(l) for l in open(p) if l.strip()]
    return [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]]) for e in ev if e["event"] == "step"]
w, s = sys.argv[1], sys.argv[2]
def cmp(a, b): a, b = steps(f"{w}/{a}-{s}.jsonl"), steps(f"{w}/{b}-{s}.jsonl"); return f"{'SAME' if a == b and a else 'DIFF'} ({len(a)} vs {len(b)} steps)"
print(f"{s}: tiny-sdar-moe CPU f32 vs GPU f32 hint 8 {cmp('cpu', 'gpu')}; GPU bf16 hint 8 vs 0 {cmp('h8', 'h0')}")
PY
done
for r in 1 2 3; do for h in 0 4 8; do
  UNMASK_MOE_HINT=$h timeout 100 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events both --warmup 1 --repeat 2 --json $W/bench-30b-h$h-r$r.json > $W/bench-30b-h$h-r$r.txt 2>&1 || echo "bench h$h FAIL"
done; done
python3 - $W <<'PY' | tee $OUT/bench.txt
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
for f in sorted(glob.glob(f"{o}/bench-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3
    for row in r["rows"]:
        print(f"{os.path.basename(f)} events {row['events']}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms, {row['ms_per_forward']/fl:.3f}x, experts {r.get('moe_experts_per_layer_pass')}")
PY
OUT=$W SHAPE=sdar-30b-a3b bash scripts/gpu_timeline.sh UNMASK_MOE_HINT=8 > /dev/null 2>&1; cp $W/timeline-*.md $OUT/ 2>/dev/null; sed -n 3,14p $OUT/timeline-*.md
cp $W/check.txt $OUT/; tar czf $OUT/raw.tgz -C $W bandwidth.json check.json $(cd $W && ls bench-*)
