#!/usr/bin/env bash
# The GPU run for the MoE path (issue 20) and long caches (issue 21 item 5), on the H200, one call.
#
#   bash scripts/gpu_moe_long.sh        # from the repo root, with .gpu/unmask.gz present
#   PART=torch bash scripts/gpu_moe_long.sh   # unmask bench and the compiled PyTorch references
#   PART=long bash scripts/gpu_moe_long.sh    # check-device and the long-cache benches only
#   PART=tune bash scripts/gpu_moe_long.sh    # scripts/moe_bench.cu's split sweep, check-device, the
#       --routing traces CPU vs GPU, and bench of the 30B-A3B shape: .gpu/unmask-old.gz (if there)
#       against .gpu/unmask.gz, with --routing, and with the sweep's best splits (UNMASK_MOE_SPLIT)
#
# Writes flat files to $OUT (default /tmp/unmask-gpu-out): moe_long.log (everything printed),
# bandwidth.json, check.json (check-device, which covers the MoE grouped kernels and the
# split-K attention against the CPU), traces of the MoE fixture, bench-*.json, torch-*.json.
# Every stage is guarded: a failing stage is reported and the next one still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
OUT=${OUT:-/tmp/unmask-gpu-out}
PART=${PART:-unmask}
mkdir -p "$OUT"
exec > >(tee "$OUT/moe_long-$PART.log") 2>&1
T0=$(date +%s)
W=$(mktemp -d)
BIN=$W/unmask
stage() { echo; echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
record() { echo "--- $1: $2"; }
export PYTHONUNBUFFERED=1

stage "setup"
unpack_unmask "$BIN" || exit 1
gpu_info

stage "device copy bandwidth (torch)"
gpu_bandwidth "$OUT/bandwidth-$PART.json" && record bandwidth ok || record bandwidth FAIL

if [[ $PART == tune ]]; then
  stage "moe_bench: the MoE kernels of an SDAR-30B-A3B sparse layer, 48 layers in a graph"
  nvcc -O3 -arch=sm_90 -o "$W/moe_bench" scripts/moe_bench.cu && record moe_bench-build ok || record moe_bench-build FAIL
  timeout 200 "$W/moe_bench" 9 dense | tee "$OUT/moe_bench-9.txt"
  timeout 200 "$W/moe_bench" 16 | tee "$OUT/moe_bench-16.txt"
  best=$(awk '/^BEST_CHAIN/{print $2}' "$OUT/moe_bench-9.txt")
  echo "best splits (9 distinct): $best"
fi

if [[ $PART == unmask || $PART == long || $PART == tune ]]; then
  stage "check-device (dense, MoE grouped kernels, split-K attention over 1900 keys) vs CPU"
  timeout 240 "$BIN" check-device --model tests/fixtures/tiny-random --device cuda --json "$OUT/check.json" > "$W/check.txt" 2>&1 \
    && record check-device PASS || record check-device FAIL
  grep -E "FAIL|MoE|cache 2048|checks," "$W/check.txt" | head -60
fi

if [[ $PART == unmask ]]; then
  stage "MoE fixture: CPU vs GPU traces (tests/fixtures/tiny-sdar-moe, greedy)"
  for s in low_confidence_static low_confidence_dynamic; do
    timeout 60 "$BIN" trace --model tests/fixtures/tiny-sdar-moe --device cpu --strategy $s --max-new-tokens 32 --out "$W/cpu-$s.jsonl" 2>&1 | tail -1
    timeout 60 "$BIN" trace --model tests/fixtures/tiny-sdar-moe --device cuda --dtype f32 --strategy $s --max-new-tokens 32 --out "$W/gpu-$s.jsonl" 2>&1 | tail -1
    python3 - "$W/cpu-$s.jsonl" "$W/gpu-$s.jsonl" "$s" <<'EOF'
import json, sys
def steps(p):
    ev = [json.loads(l) for l in open(p) if l.strip()]
    return [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]]) for e in ev if e["event"] == "step"]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
print(f"tiny-sdar-moe {sys.argv[3]}: CPU f32 vs GPU f32: {'SAME' if a == b else 'DIFF'} ({len(a)} vs {len(b)} steps)")
EOF
  done

  stage "bench: MoE shapes (grouped experts on the streamed layer), B=4 S=4, batch 1, events on and off"
  for shape in moe-small sdar-30b-a3b; do
    timeout 200 "$BIN" bench --random-init $shape --device cuda --prompt-len 64 --max-new-tokens 128 \
      --strategy low_confidence_static --events both --warmup 1 --repeat 2 --json "$OUT/bench-$shape.json" \
      && record "bench-$shape" ok || record "bench-$shape" FAIL
  done
  UNMASK_GEMV=0 timeout 200 "$BIN" bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 64 \
    --strategy low_confidence_static --events off --warmup 1 --repeat 1 --json "$OUT/bench-sdar-30b-a3b-standard.json" \
    && record "bench-30b-standard-layer" ok || record "bench-30b-standard-layer" FAIL
fi

if [[ $PART == tune ]]; then
  stage "--routing: CPU vs GPU traces of the MoE fixture (f32), experts of every committed position"
  for dev in cpu cuda; do
    timeout 60 "$BIN" trace --model tests/fixtures/tiny-sdar-moe --device $dev --dtype f32 --routing \
      --strategy low_confidence_dynamic --max-new-tokens 32 --out "$W/routing-$dev.jsonl" 2>&1 | tail -1
  done
  python3 - "$W/routing-cpu.jsonl" "$W/routing-cuda.jsonl" <<'EOF'
import json, sys
def routes(p):
    ev = [json.loads(l) for l in open(p) if l.strip()]
    return [(e["block"], e["step"], e["distinct_experts"], [(c["pos"], c["token"], [r["experts"] for r in c["routes"]]) for c in e["committed"]])
            for e in ev if e["event"] == "step"]
a, b = routes(sys.argv[1]), routes(sys.argv[2])
print(f"--routing tiny-sdar-moe CPU f32 vs GPU f32: {'SAME' if a == b else 'DIFF'} ({len(a)} vs {len(b)} steps, "
      f"{sum(len(s[3]) for s in a)} routed positions)")
EOF
  stage "bench: SDAR-30B-A3B shape, old binary vs new, --routing, best splits (static, 128 tokens, events on)"
  B30=(bench --random-init sdar-30b-a3b --device cuda --prompt-len 64 --max-new-tokens 128 --strategy low_confidence_static --warmup 1 --repeat 2)
  if [[ -f .gpu/unmask-old.gz ]]; then
    gunzip -c .gpu/unmask-old.gz > "$W/unmask-old" && chmod +x "$W/unmask-old"
    timeout 200 "$W/unmask-old" "${B30[@]}" --events on --json "$OUT/bench-30b-old.json" && record bench-30b-old ok || record bench-30b-old FAIL
  fi
  timeout 200 "$BIN" "${B30[@]}" --events on --json "$OUT/bench-30b-new.json" && record bench-30b-new ok || record bench-30b-new FAIL
  timeout 200 "$BIN" "${B30[@]}" --events on --routing --json "$OUT/bench-30b-routing.json" && record bench-30b-routing ok || record bench-30b-routing FAIL
  if [[ -n ${best:-} ]]; then
    UNMASK_MOE_SPLIT=$best timeout 200 "$BIN" "${B30[@]}" --events on --json "$OUT/bench-30b-best.json" && record "bench-30b-best $best" ok || record bench-30b-best FAIL
  fi
fi

if [[ $PART == unmask || $PART == long ]]; then
  stage "bench: long caches, SDAR-1.7B shape (split-K attention), events off"
  for p in 512 4096 16384 32000; do
    timeout 150 "$BIN" bench --random-init sdar-1.7b --device cuda --prompt-len $p --max-new-tokens 64 \
      --strategy low_confidence_static --events off --warmup 1 --repeat 2 --json "$OUT/bench-long-$p.json" \
      && record "bench-long-$p" ok || record "bench-long-$p" FAIL
  done
  UNMASK_ATTENTION_SPLIT=0 timeout 150 "$BIN" bench --random-init sdar-1.7b --device cuda --prompt-len 4096 --max-new-tokens 64 \
    --strategy low_confidence_static --events off --warmup 1 --repeat 2 --json "$OUT/bench-long-4096-nosplit.json" \
    && record "bench-long-4096-nosplit" ok || record "bench-long-4096-nosplit" FAIL
fi

if [[ $PART == torch ]]; then
  stage "side by side: unmask bench and the compiled PyTorch reference (static KV cache, torch.compile reduce-overhead), same algorithm, same shapes"
  for shape in ${TORCH_SHAPES:-sdar-1.7b sdar-4b sdar-8b sdar-30b-a3b}; do
    timeout 120 "$BIN" bench --random-init $shape --device cuda --prompt-len 64 --max-new-tokens 128 \
      --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json "$OUT/bench-$shape.json" \
      && record "bench-$shape" ok || record "bench-$shape" FAIL
    timeout 200 python3 scripts/torch_reference.py --shape $shape --compile --prompt-len 64 --max-new-tokens 128 \
      --strategy low_confidence_static --warmup 1 --repeat 2 --json "$OUT/torch-compiled-$shape.json" \
      && record "torch-compiled-$shape" ok || record "torch-compiled-$shape" FAIL
  done
fi

stage "summary"
python3 - "$OUT" <<'EOF'
import json, os, sys
o = sys.argv[1]
bw = None
for f in sorted(os.listdir(o)):
    if f.startswith("bandwidth"):
        bw = json.load(open(os.path.join(o, f)))["bytes_per_s"]
for f in sorted(os.listdir(o)):
    p = os.path.join(o, f)
    if f.startswith("bench-") and f.endswith(".json"):
        try: r = json.load(open(p))
        except Exception as e: print(f, "unreadable", e); continue
        fl = r.get("floor", {})
        floor_ms = fl.get("denoise_bytes", 0) / bw * 1e3 if bw else None
        for row in r.get("rows", []):
            ms = row.get("ms_per_forward") or row.get("ms_per_forward_median")
            x = f"{ms / floor_ms:.2f}x" if (ms and floor_ms) else "-"
            print(f"{f}: prompt {r.get('prompt_len')} events {row.get('events')} {ms} ms/forward, floor {floor_ms and round(floor_ms, 3)} ms ({fl.get('denoise_bytes', 0)/1e9:.2f} GB), {x}; experts/layer/pass {r.get('moe_experts_per_layer_pass')}; tok/s {row.get('tokens_per_s')}")
    if f.startswith("torch-") and f.endswith(".json"):
        r = json.load(open(p))
        print(f"{f}: {r.get('ms_per_forward_median'):.3f} ms/forward (CUDA events), {r.get('wall_ms_per_forward'):.3f} wall, {r.get('tokens_per_s'):.1f} tok/s")
EOF
echo "done in $(( $(date +%s) - T0 )) s"
