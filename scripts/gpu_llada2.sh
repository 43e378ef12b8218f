#!/usr/bin/env bash
# LLaDA2 (llada2_moe) on the GPU in one call (about 6 minutes): check-device on the LLaDA2
# fixture (its first checks are the fixture's; every other check, SDAR's included, is the same
# whatever --model says), `bench --random-init llada2-mini` against its floor, and CPU against
# GPU decodes of the fixture.
#
#   bash scripts/gpu_llada2.sh        # from the repo root, with .gpu/unmask-llada2.gz present
#
# Knobs (environment): UNMASK_GZ (the gzipped binary, default .gpu/unmask-llada2.gz, made by
# scripts/build-cuda.sh), OUT (where the files go, default /tmp/unmask-gpu-out), NEW_TOKENS (the
# bench's new tokens, default 128), TINY=1 (also check-device --model tests/fixtures/tiny-random).
#
# Needs: nvidia-smi, python3 with torch (the copy bandwidth every floor divides by; the GPU
# host's image). Writes at most 8 flat files to $OUT:
#   gpu_llada2.log         everything printed
#   summary.md             the figures: checks passed, decodes compared, ms/forward against the floor
#   check-llada2.json      unmask check-device --model tests/fixtures/tiny-llada2
#   check-tiny.json        unmask check-device --model tests/fixtures/tiny-random (TINY=1)
#   traces.json            CPU vs GPU decodes of the fixture (tokens and steps)
#   bench-llada2-mini.json unmask bench --random-init llada2-mini, blocks of 4
#   bench-llada2-mini-b32.json the same in LLaDA2's blocks of 32
#   bandwidth.json         device-to-device copy bandwidth
# Every stage is guarded: a failing stage is reported and the next one still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
export UNMASK_GZ=${UNMASK_GZ:-.gpu/unmask-llada2.gz}
OUT=${OUT:-/tmp/unmask-gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_llada2.log") 2>&1
T0=$(date +%s)
W=$(mktemp -d)
BIN=$W/unmask
STATUS=()
stage() { echo; echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
record() { STATUS+=("$1: $2"); echo "--- $1: $2"; }
export PYTHONUNBUFFERED=1
M=tests/fixtures/tiny-llada2
NEW=${NEW_TOKENS:-128}

stage "setup"
unpack_unmask "$BIN" || exit 1
"$BIN" --version && record setup ok || record setup FAIL

stage "nvidia-smi"
gpu_info

stage "device copy bandwidth (torch)"
gpu_bandwidth "$OUT/bandwidth.json" && record bandwidth ok || record bandwidth FAIL

stage "check-device on the LLaDA2 fixture (and the random LLaDA2, the grouped route kernel)"
timeout 240 "$BIN" check-device --model $M --device cuda --json "$OUT/check-llada2.json" \
  && record check-device-llada2 PASS || record check-device-llada2 FAIL

stage "unmask bench: llada2-mini (random bf16 weights, 16B), blocks of 4 (the grouped expert path's rows), low_confidence_static, events on, $NEW tokens after 64"
timeout 240 "$BIN" bench --random-init llada2-mini --device cuda --prompt-len 64 --max-new-tokens "$NEW" \
  --block-length 4 --steps 4 --strategy low_confidence_static --events on --warmup 1 --repeat 2 \
  --json "$OUT/bench-llada2-mini.json" && record bench-llada2-mini ok || record bench-llada2-mini FAIL

stage "unmask bench: llada2-mini in LLaDA2's own blocks of 32 (past the grouped path's 8 rows), 64 tokens after 64"
timeout 240 "$BIN" bench --random-init llada2-mini --device cuda --prompt-len 64 --max-new-tokens 64 \
  --strategy low_confidence_static --events on --warmup 1 --repeat 1 \
  --json "$OUT/bench-llada2-mini-b32.json" && record bench-llada2-mini-b32 ok || record bench-llada2-mini-b32 FAIL

stage "decode traces of the fixture: CPU vs GPU (f32 must be identical; bf16 is reported)"
TR=$W/traces; mkdir -p "$TR"
run_trace() { # name args...
  local name=$1; shift
  if timeout 60 "$BIN" trace --model $M --prompt "Once upon a time" --max-new-tokens 32 --block-length 8 \
      "$@" --out "$TR/$name.jsonl" 2> "$TR/$name.err"; then
    echo "trace $name: ok"
  else
    echo "trace $name: FAILED: $(tail -2 "$TR/$name.err")"
  fi
}
run_trace cpu --device cpu
run_trace gpu-f32 --device cuda --dtype f32
run_trace gpu-bf16 --device cuda
run_trace cpu-bf16 --device cpu --dtype bf16
run_trace gpu-bf16-routing --device cuda --routing   # --routing reads the tables back: it must run
timeout 60 python3 - "$TR" "$OUT/traces.json" <<'EOF' && record traces PASS || record traces FAIL
import json, os, sys
tr, out = sys.argv[1], sys.argv[2]
def load(name):
    p = os.path.join(tr, name + ".jsonl")
    if not os.path.exists(p): return None
    ev = [json.loads(l) for l in open(p) if l.strip()]
    steps = [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]]) for e in ev if e["event"] == "step"]
    fin = [e for e in ev if e["event"] == "finish"]
    return {"steps": steps, "finish": fin[0] if fin else None}
res, ok = [], True
for a, b, must in [("cpu", "gpu-f32", True), ("cpu-bf16", "gpu-bf16", False), ("gpu-bf16", "gpu-bf16-routing", False)]:
    A, B = load(a), load(b)
    if A is None or B is None:
        r = {"a": a, "b": b, "same": False, "why": "missing trace"}
    else:
        same = A["steps"] == B["steps"] and (A["finish"] or {}).get("output_ids") == (B["finish"] or {}).get("output_ids")
        first = next((i for i, (x, y) in enumerate(zip(A["steps"], B["steps"])) if x != y), None)
        r = {"a": a, "b": b, "same": same, "steps": (len(A["steps"]), len(B["steps"])), "first_divergent_step": first}
    r["required"] = must
    res.append(r)
    print(f"{'SAME' if r['same'] else ('DIFF' if must else 'diff (bf16, informational)'):28s} {a:18s} vs {b:18s} {r.get('steps')} first divergence {r.get('first_divergent_step')}")
    if must and not r["same"]: ok = False
json.dump(res, open(out, "w"), indent=2)
sys.exit(0 if ok else 1)
EOF

if [[ ${TINY:-0} != 0 ]]; then
  stage "check-device on tiny-random (SDAR: every check as before; the checks past the first block are the same as above)"
  timeout 300 "$BIN" check-device --model tests/fixtures/tiny-random --device cuda --json "$OUT/check-tiny.json" \
    && record check-device-tiny PASS || record check-device-tiny FAIL
fi

stage "summary"
python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, os, sys
o = sys.argv[1]
def j(n):
    try: return json.load(open(os.path.join(o, n)))
    except Exception: return None
bw, bench, traces = j("bandwidth.json"), j("bench-llada2-mini.json"), j("traces.json")
print("## LLaDA2 on the GPU: one run of scripts/gpu_llada2.sh\n")
if bw: print(f"- device: {bw['device']}; device-to-device copy bandwidth {bw['bytes_per_s']/1e12:.3f} TB/s (read + write, 4 GiB, median of 10)")
for name in ["check-llada2.json", "check-tiny.json"]:
    c = j(name)
    if c:
        n = len(c["checks"]); bad = [x["name"] for x in c["checks"] if not x["pass"]]
        print(f"- {name[:-5]}: {n - len(bad)}/{n} checks pass" + (f"; failing: {bad}" if bad else ""))
        for x in c["checks"]:
            if "LLaDA2" in x["name"] or "grouped route" in x["name"] or (name == "check-llada2.json" and x["name"].startswith("logits") and "heads" not in x["name"] and "MoE" not in x["name"] and "cache 2048" not in x["name"]):
                print(f"  - {x['name']}: {x['value']:.2e} (limit {x['limit']:.0e}) {'PASS' if x['pass'] else 'FAIL'}")
if traces:
    for t in traces:
        print(f"- decode {t['a']} vs {t['b']}: {'same' if t['same'] else 'differs from step ' + str(t.get('first_divergent_step'))}" + (" (required)" if t["required"] else " (bf16, informational)"))
for bench in [bench, j("bench-llada2-mini-b32.json")]:
    if not (bench and "rows" in bench):
        continue
    r = bench["rows"][0]
    rb = bench["floor"]["denoise_bytes"]
    print(f"\n### llada2-mini (random bf16 weights, {bench['weight_bytes']/1e9:.2f} GB), prompt {bench['prompt_len']}, {bench['max_new_tokens']} new tokens, B={bench['block_length']} S={bench['steps']}")
    print(f"paths: {bench['run']}")
    if bench.get("moe_experts_per_layer_pass") is not None:
        print(f"- {bench['moe_experts_per_layer_pass']:.1f} distinct experts per sparse layer per block pass (counted on the device)")
    print(f"- bytes a denoising pass reads: {rb/1e9:.3f} GB (the distinct experts counted, the shared expert, router, attention, lm_head)")
    if bw:
        floor = rb / bw["bytes_per_s"] * 1e3
        print(f"- floor {floor:.3f} ms per forward; unmask {r['ms_per_forward']:.3f} ms per forward = **{r['ms_per_forward']/floor:.2f}x the floor** (goal at B=4: at most 2x); {r['tokens_per_s']:.1f} tok/s")
    else:
        print(f"- unmask {r['ms_per_forward']:.3f} ms per forward, {r['tokens_per_s']:.1f} tok/s (no bandwidth: no floor)")
EOF
echo
echo "stages: ${STATUS[*]}"
echo "total $(( $(date +%s) - T0 )) s; files in $OUT:"; ls -l "$OUT"
rm -rf "$W"
sleep 1  # let tee flush gpu_llada2.log
