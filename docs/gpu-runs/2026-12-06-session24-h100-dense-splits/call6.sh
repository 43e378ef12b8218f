#!/usr/bin/env bash
# Session 24, call 6: the 30B-A3B's q|k|v at 8 steps a batch as built (gemv.rs MEASURED_PACKED) against main's
# 4 (UNMASK_GEMV_SPLIT=5120x2048=4/2/4), alternating; check-device; the MoE fixture's decodes; the timeline.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gpu_bandwidth $W/bandwidth.json
timeout 120 $BIN check-device --model tests/fixtures/tiny-random --device cuda > $W/check.txt 2>&1; echo "check-device rc $? $(grep -E 'checks,' $W/check.txt)"
for s in low_confidence_static low_confidence_dynamic; do
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cpu --strategy $s --max-new-tokens 32 --out $W/cpu-$s.jsonl > /dev/null 2>&1
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --dtype f32 --strategy $s --max-new-tokens 32 --out $W/gpu-$s.jsonl > /dev/null 2>&1
  python3 - $W $s <<'PY'
import json, sys
def steps(p):
    ev = [json.loads(l) for l in open(p) if l.strip()]
    return [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]]) for e in ev if e["event"] == "step"]
w, s = sys.argv[1], sys.argv[2]; a, b = steps(f"{w}/cpu-{s}.jsonl"), steps(f"{w}/gpu-{s}.jsonl")
print(f"{s}: tiny-sdar-moe CPU f32 vs GPU f32 {'SAME' if a == b and a else 'DIFF'} ({len(a)} vs {len(b)} steps)")
PY
done
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
OUT=$W SHAPE=sdar-30b-a3b bash scripts/gpu_timeline.sh > /dev/null 2>&1; cp $W/timeline-*.md $OUT/timeline.md 2>/dev/null; sed -n 1,12p $OUT/timeline.md
cp $W/final.txt $W/check.txt $OUT/; tar czf $OUT/raw.tgz -C $W bandwidth.json $(cd $W && ls b-*.json)
