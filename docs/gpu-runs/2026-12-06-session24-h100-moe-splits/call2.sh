#!/usr/bin/env bash
# Session 24, call 2: main (f705f71 + nothing) on the H200: check-device, the 30B-A3B bench, and a sweep
# of the grouped experts' splits in the model (UNMASK_MOE_SPLIT=UP_KS/UP_TB,DOWN_KS/DOWN_TB; default 4/2,2/4):
# up first (down at 2/4), then down with the best up, then the best pair against the default, alternating.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gpu_bandwidth $W/bandwidth.json
timeout 120 $BIN check-device --model tests/fixtures/tiny-random --device cuda --json $W/check.json > $W/check.txt 2>&1; echo "check-device rc $?"
grep -E "FAIL|checks," $W/check.txt | head -4
bench() {  # bench NAME SPLIT EVENTS -> prints ms/forward (events on row)
  UNMASK_MOE_SPLIT=$2 timeout 90 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events $3 --warmup 1 --repeat 2 --json $W/b-$1.json > $W/b-$1.txt 2>&1 || { echo 99; return; }
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(min(x['ms_per_forward'] for x in r['rows'] if x['events']=='on'))" $W/b-$1.json
}
echo "split ms/forward(events on)" > $W/sweep.txt
best_up=4/2; best=$(bench base0 4/2,2/4 on); echo "4/2,2/4 $best" | tee -a $W/sweep.txt
for up in 2/4 8/1 8/2 4/4 2/2 4/1 16/1 2/8; do
  v=$(bench up-${up/\//_} $up,2/4 on); echo "$up,2/4 $v" | tee -a $W/sweep.txt
  if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" $v $best; then best=$v; best_up=$up; fi
done
best_down=2/4
for dn in 1/8 4/2 2/2 4/4 2/8 1/16 8/1 1/4; do
  v=$(bench dn-${dn/\//_} $best_up,$dn on); echo "$best_up,$dn $v" | tee -a $W/sweep.txt
  if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" $v $best; then best=$v; best_down=$dn; fi
done
echo "best $best_up,$best_down $best" | tee -a $W/sweep.txt
for r in 1 2 3; do
  bench final-base-r$r 4/2,2/4 both > /dev/null; bench final-best-r$r $best_up,$best_down both > /dev/null
done
python3 - $W <<'PY' | tee $W/final.txt
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
for f in sorted(glob.glob(f"{o}/b-final-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3
    for row in r["rows"]:
        ev = (row["event_build_ms"] + row["event_write_ms"]) / row["decode_ms"] * 100 if row["decode_ms"] else 0
        print(f"{os.path.basename(f)} events {row['events']}: {row['ms_per_forward']:.4f} ms/forward, floor {fl:.3f} ms, {row['ms_per_forward']/fl:.3f}x, {row['tokens_per_s']:.1f} tok/s, events {ev:.2f} % of decode, experts {r.get('moe_experts_per_layer_pass'):.2f}")
PY
cp $W/check.txt $W/sweep.txt $W/final.txt $OUT/; tar czf $OUT/raw.tgz -C $W bandwidth.json check.json $(cd $W && ls b-*.json)
