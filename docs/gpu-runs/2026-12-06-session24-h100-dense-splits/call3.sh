#!/usr/bin/env bash
# Session 24, call 3: the dense splits of the 30B-A3B's o (2048 x 4096) and q|k|v (5120 x 2048) in the model,
# through UNMASK_GEMV_SPLIT (new): o's default block (16 warps, 116 registers a thread: 59 K of an SM's
# 64 K) cannot share an SM with an attention block (512 x 34 registers), so its weights start only as
# attention's blocks leave; with 8 warps it can, and asks for half its weights during attention.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gpu_bandwidth $W/bandwidth.json
bench() {  # bench NAME SPLIT EVENTS -> ms/forward (events on)
  UNMASK_GEMV_SPLIT="$2" timeout 90 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events $3 --warmup 1 --repeat 2 --json $W/b-$1.json > $W/b-$1.txt 2>&1 || { echo 99; tail -2 $W/b-$1.txt >&2; return; }
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(min(x['ms_per_forward'] for x in r['rows'] if x['events']=='on'))" $W/b-$1.json
}
declare -A S=([base]="" [o8]="2048x4096=8/1/8" [o4]="2048x4096=4/1/8" [o8u4]="2048x4096=8/1/4" [q48]="5120x2048=4/2/8" [q81]="5120x2048=8/1/8" [q41]="5120x2048=4/1/8")
echo "setting split ms/forward(events on)" > $W/sweep.txt
for r in 1 2; do for n in base o8 o4 o8u4 q48 q81 q41; do
  echo "$n '${S[$n]}' r$r $(bench $n-r$r "${S[$n]}" on)" | tee -a $W/sweep.txt
done; done
python3 - $W > $W/best.txt <<'PY'
import re, sys
rows = [l.split() for l in open(f"{sys.argv[1]}/sweep.txt") if l.strip() and not l.startswith("setting")]
best = {}
for r in rows: best.setdefault(r[0], []).append(float(r[-1]))
med = {k: sum(v) / len(v) for k, v in best.items()}
o = min((k for k in med if k.startswith("o")), key=med.get); q = min((k for k in med if k.startswith("q")), key=med.get)
print(o if med[o] < med["base"] else "-", q if med[q] < med["base"] else "-")
PY
read bo bq < $W/best.txt; [[ $bo == - ]] && bo=; [[ $bq == - ]] && bq=; echo "best o: ${bo:-none}, best q|k|v: ${bq:-none}" | tee -a $W/sweep.txt
combo=$( (for n in $bo $bq; do printf '%s;' "${S[$n]}"; done) | sed 's/;$//')
if [[ -n $combo ]]; then
  UNMASK_GEMV_SPLIT="$combo" timeout 120 $BIN check-device --model tests/fixtures/tiny-random --device cuda > $W/check.txt 2>&1; echo "check-device rc $? $(grep -E 'checks,' $W/check.txt)"
  for r in 1 2 3; do bench final-base-r$r "" both > /dev/null; bench final-new-r$r "$combo" both > /dev/null; done
  python3 - $W "$combo" <<'PY' | tee $W/final.txt
import json, glob, os, sys
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s; new = UNMASK_GEMV_SPLIT='{sys.argv[2]}'")
for f in sorted(glob.glob(f"{o}/b-final-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3
    for row in r["rows"]:
        ev = (row["event_build_ms"] + row["event_write_ms"]) / row["decode_ms"] * 100
        print(f"{os.path.basename(f)} events {row['events']}: {row['ms_per_forward']:.4f} ms/forward, {row['ms_per_forward']/fl:.3f}x, {row['tokens_per_s']:.1f} tok/s, events {ev:.2f} %")
PY
  OUT=$W SHAPE=sdar-30b-a3b bash scripts/gpu_timeline.sh UNMASK_GEMV_SPLIT="$combo" > /dev/null 2>&1; cp $W/timeline-*.md $OUT/timeline.md 2>/dev/null; sed -n 1,12p $OUT/timeline.md
fi
cp $W/sweep.txt $W/final.txt $W/check.txt $OUT/ 2>/dev/null; tar czf $OUT/raw.tgz -C $W bandwidth.json $(cd $W && ls b-*.json)
