#!/usr/bin/env bash
# Session 25, call 1 (prepared in session 24). Build first: git cherry-pick 30367fa 381213e (both trials), then
# scripts/build-cuda.sh. One binary times main's kernels (UNMASK_KERNELS=.gpu/main-kernels: session 24's main,
# 4be21b3; the trial binary passes the route and gate|up kernels one parameter more, which main's ignore) against:
#  - spec: UNMASK_MOE_SPEC=1, gate|up guesses its expert and loads its first batch before its wait (381213e)
#  - o16 / q16: UNMASK_GEMV_SPLIT o at 8/1/16 (all its weights before its wait, an 8-warp block that can share an
#    SM with attention) / q|k|v at 4/2/16 (30367fa)
# Correctness first: check-device under each; the MoE fixture's decodes under spec equal to without (no output may
# change: nothing depends on the numbering) and CPU f32 = GPU f32 under spec. Then timelines of main and the best.
set -uo pipefail
source scripts/gpu_common.sh
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
W=$(mktemp -d); BIN=$W/unmask
unpack_unmask $BIN > /dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gpu_bandwidth $W/bandwidth.json
declare -A S=([main]="UNMASK_KERNELS=$PWD/.gpu/main-kernels" [trial]="" [spec]="UNMASK_MOE_SPEC=1" [o16]="UNMASK_GEMV_SPLIT=2048x4096=8/1/16" [q16]="UNMASK_GEMV_SPLIT=5120x2048=4/2/16" [qold]="UNMASK_GEMV_SPLIT=5120x2048=4/2/4")
for n in spec o16 q16; do
  env ${S[$n]} timeout 120 $BIN check-device --model tests/fixtures/tiny-random --device cuda > $W/check-$n.txt 2>&1; echo "check-device $n rc $? $(grep -E 'checks,' $W/check-$n.txt)"; grep FAIL $W/check-$n.txt | head -3
done
for s in low_confidence_static low_confidence_dynamic; do
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cpu --strategy $s --max-new-tokens 32 --out $W/cpu-$s.jsonl > /dev/null 2>&1
  UNMASK_MOE_SPEC=1 timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --dtype f32 --strategy $s --max-new-tokens 32 --out $W/gpu-$s.jsonl > /dev/null 2>&1
  UNMASK_MOE_SPEC=1 timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --strategy $s --max-new-tokens 32 --out $W/s1-$s.jsonl > /dev/null 2>&1
  timeout 60 $BIN trace --model tests/fixtures/tiny-sdar-moe --device cuda --strategy $s --max-new-tokens 32 --out $W/s0-$s.jsonl > /dev/null 2>&1
  python3 - $W $s <<'PY'
import json, sys
def steps(p):
    ev = [json.loads(l) for l in open(p) if l.strip()]
    return [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]]) for e in ev if e["event"] == "step"]
w, s = sys.argv[1], sys.argv[2]
def cmp(a, b): a, b = steps(f"{w}/{a}-{s}.jsonl"), steps(f"{w}/{b}-{s}.jsonl"); return f"{'SAME' if a == b and a else 'DIFF'} ({len(a)} vs {len(b)} steps)"
print(f"{s}: tiny-sdar-moe CPU f32 vs GPU f32 spec {cmp('cpu', 'gpu')}; GPU bf16 spec vs not {cmp('s1', 's0')}")
PY
done
for r in 1 2 3; do for n in main trial spec o16 q16 qold; do
  env ${S[$n]} timeout 90 $BIN bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json $W/b-$n-r$r.json > $W/b-$n-r$r.txt 2>&1 || { echo "bench $n FAIL"; tail -2 $W/b-$n-r$r.txt; }
done; done
python3 - $W <<'PY' | tee $W/final.txt
import json, glob, os, sys, collections
o = sys.argv[1]; bw = json.load(open(f"{o}/bandwidth.json"))["bytes_per_s"]
print(f"bandwidth {bw/1e12:.3f} TB/s")
m = collections.defaultdict(list)
for f in sorted(glob.glob(f"{o}/b-*.json")):
    r = json.load(open(f)); fl = r["floor"]["denoise_bytes"] / bw * 1e3; ms = r["rows"][0]["ms_per_forward"]
    m[os.path.basename(f).split("-")[1]].append((ms, ms / fl))
for n, v in m.items(): print(n, " ".join(f"{a:.4f}" for a, _ in v), "ms/forward;", " ".join(f"{b:.3f}x" for _, b in v))
PY
for n in main spec o16; do
  mkdir -p $W/t-$n; OUT=$W/t-$n SHAPE=sdar-30b-a3b bash scripts/gpu_timeline.sh ${S[$n]} > /dev/null 2>&1
  cp $W/t-$n/timeline-*.md $OUT/timeline-$n.md 2>/dev/null; echo "== $n"; sed -n 3,11p $OUT/timeline-$n.md; tail -10 $OUT/timeline-$n.md
done
cat $W/check-*.txt > $W/checks.txt; cp $W/final.txt $W/checks.txt $OUT/; tar czf $OUT/raw.tgz -C $W bandwidth.json $(cd $W && ls b-*.json)
