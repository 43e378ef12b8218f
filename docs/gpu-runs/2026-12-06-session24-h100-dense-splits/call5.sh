#!/usr/bin/env bash
# Session 24, call 5: more dense splits in the model, through UNMASK_GEMV_SPLIT, alternating three times:
# the 30B-A3B's o (2048 x 4096) and router (128 x 2048) with its q|k|v at call 4's 4/2/8; SDAR-1.7B's
# o (2048 x 2048), gate|up (6144 x 2048, paired) and down (2048 x 6144) with its q|k|v at call 4's 8/2/8.
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
Q=5120x2048=4/2/8
declare -A S=([main]="" [q]="$Q" [o1614]="$Q;2048x4096=16/1/4" [o828]="$Q;2048x4096=8/2/8" [o824]="$Q;2048x4096=8/2/4" [r1614]="$Q;128x2048=16/1/4" [r418]="$Q;128x2048=4/1/8" [r814]="$Q;128x2048=8/1/4")
for r in 1 2 3; do for n in main q o1614 o828 o824 r1614 r418 r814; do
  echo "30b $n '${S[$n]}' r$r $(bench sdar-30b-a3b 30b-$n-r$r "${S[$n]}")" | tee -a $W/sweep.txt
done; done
D=4096x2048=8/2/8
declare -A T=([main]="" [q]="$D" [o1618]="$D;2048x2048=16/1/8" [o814]="$D;2048x2048=8/1/4" [o828]="$D;2048x2048=8/2/8" [g818]="$D;6144x2048=8/1/8" [g814]="$D;6144x2048=8/1/4" [d828]="$D;2048x6144=8/2/8" [d1614]="$D;2048x6144=16/1/4")
for r in 1 2 3; do for n in main q o1618 o814 o828 g818 g814 d828 d1614; do
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
