#!/usr/bin/env bash
# Session 20, call 2: the MoE forms (UNMASK_MOE_FORM) side by side, one binary, alternating.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(nvcc -O3 -arch=sm_90 -o $W/moe_bench scripts/moe_bench.cu > $W/nvcc.txt 2>&1; echo "nvcc rc $?" >> $W/nvcc.txt) &
gpu_bandwidth $OUT/bandwidth.json
timeout 240 $BIN check-device --model tests/fixtures/tiny-random --device cuda --json $OUT/check.json > $OUT/check.txt 2>&1; echo "check-device rc $?"
grep -E "FAIL|MoE.*(vs 4|early|route_up|down_sum)|checks," $OUT/check.txt | grep -E "FAIL|vs 4|checks," | head -30
for r in 1 2; do for f in four early down_sum,early route_up; do
  UNMASK_MOE_FORM=$f timeout 150 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json $OUT/bench-${f/,/+}-r$r.json > $W/b.txt 2>&1 || { echo "bench $f FAIL"; tail -5 $W/b.txt; }
done; done
wait; tail -1 $W/nvcc.txt
timeout 120 compute-sanitizer --tool racecheck $W/moe_bench check > $W/rc.txt 2>&1; echo "racecheck rc $?"; grep -E "CHECK|SUMMARY" $W/rc.txt
timeout 120 compute-sanitizer --tool memcheck $W/moe_bench check > $W/mc.txt 2>&1; echo "memcheck rc $?"; grep -E "CHECK|SUMMARY" $W/mc.txt
timeout 150 $W/moe_bench 9 > $W/mb.txt 2>&1; echo "moe_bench rc $?"; grep -E "^  (four|two)|^(rows|packed)|BEST" $W/mb.txt | grep -v "split"
python3 - $OUT <<'PY'
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
for f in sorted(glob.glob(f"{o}/bench-*.json")):
    r = json.load(open(f)); row = r["rows"][0]; fl = r["floor"]["denoise_bytes"] / bw * 1e3
    print(f"{os.path.basename(f)}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms, {row['ms_per_forward']/fl:.3f}x, experts {r.get('moe_experts_per_layer_pass'):.2f}, tok/s {row['tokens_per_s']:.1f}")
PY
