#!/usr/bin/env bash
# session 18 call 4: check-device (tensor-core split attention), long caches base vs new, 30B at 4096, ncu of split/merge
set -uo pipefail
source scripts/gpu_common.sh
T0=$(date +%s); st() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
for v in base new; do xz -dc .gpu/$v.xz | gzip -1 > /tmp/$v.gz; UNMASK_GZ=/tmp/$v.gz unpack_unmask /tmp/$v > /dev/null || exit 1; done
gpu_bandwidth $OUT/bandwidth.json | tail -1
st check-device
timeout 240 /tmp/new check-device --model tests/fixtures/tiny-random --device cuda --json /tmp/check.json > $OUT/check.log 2>&1; echo "check rc=$?"
grep -E "FAIL|checks,|cache 2048" $OUT/check.log | head -20
st long
echo -e "binary\tshape\tprompt\tms_per_forward\tdenoise_ms\tstored_ms\tfloor_denoise_bytes" > $OUT/long.tsv
for sp in sdar-1.7b:512 sdar-1.7b:4096 sdar-1.7b:16000 sdar-1.7b:32000 sdar-30b-a3b:4096 sdar-8b:4096; do for v in base new; do
  s=${sp%%:*}; p=${sp##*:}
  timeout 150 /tmp/$v bench --random-init $s --device cuda --prompt-len $p --max-new-tokens 64 --strategy low_confidence_static --events off --warmup 1 --repeat 2 --json /tmp/b.json > /tmp/b.log 2>&1 || { echo "FAIL $v $sp"; tail -3 /tmp/b.log; continue; }
  python3 -c "
import json;d=json.load(open('/tmp/b.json'));r=d['rows'][0]
print('\t'.join(map(str,['$v','$s',$p,round(r['ms_per_forward'],4),round(r['denoise_ms_median'],4),round(r['stored_ms_median'],4),d['floor']['denoise_bytes']])))" | tee -a $OUT/long.tsv
done; done
st ncu
xz -dc .gpu/new.xz | gzip -1 > .gpu/unmask.gz
OUT=$OUT SHAPE=sdar-1.7b PROMPT=32000 FILTER='attention_(split|merge)' SKIP=0 LAUNCHES=112 bash scripts/gpu_profile.sh 2>&1 | tail -5
mv $OUT/ncu-default.csv $OUT/ncu-1.7b-32000.csv
st done
