#!/usr/bin/env bash
# Session 20, call 1: the MoE two-kernel form against the four-kernel form, one binary.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
(nvcc -O3 -arch=sm_90 -o $W/moe_bench scripts/moe_bench.cu > $OUT/moe_bench_build.txt 2>&1; echo "nvcc rc $?" >> $OUT/moe_bench_build.txt) &
gpu_bandwidth $OUT/bandwidth.json
timeout 180 $BIN check-device --model tests/fixtures/tiny-random --device cuda --json $OUT/check.json > $OUT/check.txt 2>&1; echo "check-device rc $?"
grep -E "FAIL|MoE|checks," $OUT/check.txt | head -30
for r in 1 2; do for f in 0 1; do
  UNMASK_MOE_FUSED=$f timeout 150 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json $OUT/bench-fused$f-r$r.json > $W/b.txt 2>&1 || { echo "bench fused=$f FAIL"; tail -5 $W/b.txt; }
  grep -E "^\| low|loaded" $W/b.txt | sed "s/^/fused=$f r$r: /"
done; done
wait; tail -3 $OUT/moe_bench_build.txt
timeout 150 compute-sanitizer --tool racecheck $W/moe_bench check > $OUT/racecheck.txt 2>&1; echo "racecheck rc $?"; tail -6 $OUT/racecheck.txt
timeout 150 compute-sanitizer --tool memcheck $W/moe_bench check > $OUT/memcheck.txt 2>&1; echo "memcheck rc $?"; tail -4 $OUT/memcheck.txt
timeout 120 $W/moe_bench 9 > $OUT/moe_bench-9.txt 2>&1; echo "moe_bench rc $?"; grep -iE "chain|route|BEST" $OUT/moe_bench-9.txt | head -30
python3 - $OUT <<'PY'
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
for f in sorted(glob.glob(f"{o}/bench-*.json")):
    r = json.load(open(f)); row = r["rows"][0]; fl = r["floor"]["denoise_bytes"] / bw * 1e3
    print(f"{os.path.basename(f)}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms, {row['ms_per_forward']/fl:.3f}x, experts {r.get('moe_experts_per_layer_pass')}, tok/s {row['tokens_per_s']:.1f}")
PY
