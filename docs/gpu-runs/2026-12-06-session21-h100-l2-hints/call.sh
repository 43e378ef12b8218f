#!/usr/bin/env bash
# Session 21, call 2: the committed MoE form with L2 hints (UNMASK_L2 bits), side by side.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
gunzip -c .gpu/unmask-l2.gz > $BIN && chmod +x $BIN
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(nvcc -O3 -arch=sm_90 -o $W/moe_bench scripts/moe_bench.cu > $W/nvcc.txt 2>&1; echo "nvcc rc $?" >> $W/nvcc.txt) &
gpu_bandwidth $OUT/bandwidth.json
timeout 150 $BIN check-device --model tests/fixtures/tiny-random --device cuda --json $OUT/check.json > $OUT/check.txt 2>&1; echo "check-device rc $?"
grep -E "FAIL|checks," $OUT/check.txt | head -12
wait; tail -1 $W/nvcc.txt
timeout 60 compute-sanitizer --tool racecheck $W/moe_bench check 2>&1 | grep -E "CHECK|SUMMARY"
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
for v in 0:32:20 15:32:20 31:32:20 3:32:20 5:32:20 31:32:32 31:24:12 0:32:20 31:32:20; do
  IFS=: read bits mb spec <<< "$v"
  UNMASK_L2=$bits UNMASK_L2_BUDGET_MB=$mb UNMASK_L2_SPEC_MB=$spec timeout 100 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json $W/b.json > $W/b.txt 2>&1 || { echo "bench $v FAIL"; tail -3 $W/b.txt; }
  i=$(ls $OUT | grep -c "^bench-"); cp $W/b.json $OUT/bench-$i-l2_${bits}-down${mb}-spec${spec}.json
  python3 -c "import json,sys; r=json.load(open('$W/b.json')); print('$v', round(r['rows'][0]['ms_per_forward'],4))"
done
python3 - $OUT <<'PY'
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
for f in sorted(glob.glob(f"{o}/bench-*.json"), key=lambda f: int(os.path.basename(f).split('-')[1])):
    r = json.load(open(f)); row = r["rows"][0]; fl = r["floor"]["denoise_bytes"] / bw * 1e3
    print(f"{os.path.basename(f)}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms, {row['ms_per_forward']/fl:.3f}x, experts {r.get('moe_experts_per_layer_pass'):.2f}, tok/s {row['tokens_per_s']:.1f}")
PY
