#!/usr/bin/env bash
# Session 21, call 4: the router product and the routing in one kernel (UNMASK_MOE_ROUTER=apart: two), side by side.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gpu_bandwidth $OUT/bandwidth.json
timeout 150 $BIN check-device --model tests/fixtures/tiny-random --device cuda --json $OUT/check.json > $W/check.txt 2>&1; echo "check-device rc $?"
grep -E "FAIL|checks," $W/check.txt | head -12; grep -E "MoE" $W/check.txt | head -8
for s in low_confidence_static low_confidence_dynamic; do
  for d in "cpu" "cuda --dtype f32" "cuda"; do
    timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device $d --strategy $s --max-new-tokens 32 --out "$W/${d// /_}-$s.jsonl" > /dev/null 2>&1 || echo "trace $d $s FAIL"
  done
  python3 - $W/cpu-$s.jsonl "$W/cuda_--dtype_f32-$s.jsonl" $W/cuda-$s.jsonl $s <<'PY'
import json, sys
def steps(p):
    ev = [json.loads(l) for l in open(p) if l.strip()]
    return [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]]) for e in ev if e["event"] == "step"]
a, b, c = steps(sys.argv[1]), steps(sys.argv[2]), steps(sys.argv[3])
print(f"tiny-sdar-moe {sys.argv[4]}: CPU f32 vs GPU f32 {'SAME' if a == b else 'DIFF'} ({len(a)} vs {len(b)} steps); GPU bf16 {len(c)} steps")
PY
done
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --max-new-tokens 16 --out $W/san.jsonl > $W/san.txt 2>&1; echo "$tool rc $?"; grep -E "SUMMARY|ERROR" $W/san.txt | head -3
done
for r in 1 2; do for m in fused apart; do
  v=""; [[ $m == apart ]] && v=apart
  UNMASK_MOE_ROUTER=$v timeout 100 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json $OUT/bench-$m-r$r.json > $W/b.txt 2>&1 || { echo "bench $m FAIL"; tail -3 $W/b.txt; }
  python3 -c "import json; r=json.load(open('$OUT/bench-$m-r$r.json')); print('$m r$r', round(r['rows'][0]['ms_per_forward'],4))"
done; done
timeout 100 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events both --warmup 1 --repeat 2 --json $OUT/bench-both.json > $OUT/bench-both.txt 2>&1 || echo "bench both FAIL"
grep -E "^\| low|events work" $OUT/bench-both.txt
python3 - $OUT <<'PY'
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
for f in sorted(glob.glob(f"{o}/bench-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3
    for row in r["rows"]:
        print(f"{os.path.basename(f)} events {row['events']}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms, {row['ms_per_forward']/fl:.3f}x, experts {r.get('moe_experts_per_layer_pass'):.2f}, tok/s {row['tokens_per_s']:.1f}")
PY
