#!/usr/bin/env bash
# Session 24, call 4: q|k|v splits with 8 steps a batch (call 3: 4/2/8 beat 4/2/4 on the 30B-A3B), on the
# 30B-A3B (5120 x 2048) and SDAR-1.7B (4096 x 2048), alternating, through UNMASK_GEMV_SPLIT.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gpu_bandwidth $W/bandwidth.json
bench() {  # bench SHAPE NAME SPLIT -> ms/forward (events on)
  UNMASK_GEMV_SPLIT="$3" timeout 90 $BIN bench --random-init $1 --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json $W/b-$2.json > $W/b-$2.txt 2>&1 || { echo 99; tail -2 $W/b-$2.txt >&2; return; }
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"{min(x['ms_per_forward'] for x in r['rows']):.4f}\")" $W/b-$2.json
}
declare -A S=([base]="" [q424]="5120x2048=4/2/4" [q428]="5120x2048=4/2/8" [q248]="5120x2048=2/4/8" [q448]="5120x2048=4/4/8" [q228]="5120x2048=2/2/8" [q828]="5120x2048=8/2/8" [q418]="5120x2048=4/1/8")
for r in 1 2 3; do for n in q424 q428 q248 q448 q228 q828 q418; do
  echo "30b $n '${S[$n]}' r$r $(bench sdar-30b-a3b 30b-$n-r$r "${S[$n]}")" | tee -a $W/sweep.txt
done; done
declare -A T=([d1614]="" [d1618]="4096x2048=16/1/8" [d818]="4096x2048=8/1/8" [d828]="4096x2048=8/2/8" [d428]="4096x2048=4/2/8" [d424]="4096x2048=4/2/4")
for r in 1 2 3; do for n in d1614 d1618 d818 d828 d428 d424; do
  echo "1.7b $n '${T[$n]}' r$r $(bench sdar-1.7b 17b-$n-r$r "${T[$n]}")" | tee -a $W/sweep.txt
done; done
python3 - $W <<'PY' | tee $W/summary.txt
import json, sys, collections
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
m = collections.defaultdict(list)
for l in open(f"{o}/sweep.txt"):
    f = l.split(); m[(f[0], f[1], f[2])].append(float(f[-1]))
for k, v in m.items(): print(*k, " ".join(f"{x:.4f}" for x in v), f"mean {sum(v)/len(v):.4f}")
PY
cp $W/sweep.txt $OUT/; tar czf $OUT/raw.tgz -C $W bandwidth.json $(cd $W && ls b-*.json)
