#!/usr/bin/env bash
# session 18 call 6: q/k prep folded into the staged attention: check-device, A/B (UNMASK_ATTENTION_PREP=0/1)
set -uo pipefail
source scripts/gpu_common.sh
T0=$(date +%s); st() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
unpack_unmask /tmp/new > /dev/null || exit 1
gpu_bandwidth $OUT/bandwidth.json | tail -1
st check-device
timeout 200 /tmp/new check-device --model tests/fixtures/tiny-random --device cuda --json /tmp/check.json > $OUT/check.log 2>&1; echo "check rc=$?"
grep -E "FAIL|checks," $OUT/check.log | head -20
st ab
echo -e "shape\tprep\tround\tms_per_forward\tdenoise_ms\tstored_ms" > $OUT/ab.tsv
for r in 1 2; do for s in sdar-1.7b sdar-30b-a3b; do for v in 1 0; do
  UNMASK_ATTENTION_PREP=$v timeout 120 /tmp/new bench --random-init $s --device cuda --prompt-len 64 --max-new-tokens 128 --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json /tmp/b.json > /tmp/b.log 2>&1 || { echo "FAIL $s $v"; tail -3 /tmp/b.log; continue; }
  python3 -c "
import json;d=json.load(open('/tmp/b.json'));r=d['rows'][0]
print('\t'.join(map(str,['$s',$v,$r,round(r['ms_per_forward'],4),round(r['denoise_ms_median'],4),round(r['stored_ms_median'],4)])))" | tee -a $OUT/ab.tsv
  [ $r = 1 ] && [ $v = 1 ] && cp /tmp/b.json $OUT/shape-$s.json
done; done; done
st done
