#!/usr/bin/env bash
# session 18 call 1: moe_bench sweeps (packed experts, router form, dense packed splits), check-device, 30B A/B
set -uo pipefail
source scripts/gpu_common.sh
T0=$(date +%s); st() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
st setup
UNMASK_GZ=.gpu/unmask.gz unpack_unmask /tmp/new >/dev/null || exit 1

nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
gpu_bandwidth $OUT/bandwidth.json | tail -1
st moe_bench
nvcc -O3 -arch=sm_90 -o /tmp/moe_bench scripts/moe_bench.cu || echo "moe_bench build FAIL"
timeout 240 /tmp/moe_bench 9 dense > $OUT/moe_bench.txt 2>&1; echo "moe_bench rc=$?"
grep -E "route|combine:|model splits|BEST|best|router form|tables|FAIL" $OUT/moe_bench.txt
st check-device
timeout 200 /tmp/new check-device --model tests/fixtures/tiny-random --device cuda --json $OUT/check.json > $OUT/check.log 2>&1; echo "check rc=$?"
grep -E "FAIL|checks,|MoE|repack" $OUT/check.log | head -30
best=$(awk '/^BEST_CHAIN packed/{print $3}' $OUT/moe_bench.txt)
echo "best packed chain splits: $best"
st ab
echo -e "variant\tround\tms_per_forward\tdenoise_ms\tstored_ms\tprefill_ms\texperts" > $OUT/ab.tsv
for r in 1 2; do for v in new separate bestsplit; do
  B=/tmp/new; E=""; [ $v = base ] && B=/tmp/base; [ $v = separate ] && E="UNMASK_ROUTER_ROUTES=0"; [ $v = bestsplit ] && E="UNMASK_MOE_SPLIT=$best"
  env $E timeout 120 $B bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json /tmp/b.json > /tmp/b.log 2>&1 || { echo "FAIL $v"; tail -3 /tmp/b.log; }
  python3 -c "
import json;d=json.load(open('/tmp/b.json'));r=d['rows'][0]
print('\t'.join(map(str,['$v',$r,round(r['ms_per_forward'],4),round(r['denoise_ms_median'],4),round(r['stored_ms_median'],4),round(r['prefill_ms_median'],3),round(d['moe_experts_per_layer_pass'],3)])))" | tee -a $OUT/ab.tsv
  [ $r = 1 ] && cp /tmp/b.json $OUT/shape-30b-$v.json
done; done
st done
