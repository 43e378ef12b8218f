#!/usr/bin/env bash
# The one GPU run: every figure docs/perf.md reports for a card, in one call (about 8 minutes).
#
#   bash scripts/gpu_run.sh            # from the repo root, with .gpu/unmask.gz present
#
# Knobs (environment): SHAPES (the shapes benched, default sdar-1.7b sdar-4b sdar-8b
# sdar-30b-a3b), COMPILED_SHAPES (those also run by the compiled PyTorch reference; the MoE
# one takes minutes, so it is left out unless named), LONG (the long-cache prompt lengths),
# ABLATIONS (the switch comparisons, names below), GEMV_BENCH=1 (also scripts/gemv_bench.cu),
# OUT (where the files go).
#
# Needs: .gpu/unmask.gz (scripts/build-cuda.sh), nvidia-smi, nvcc, python3 with torch + transformers
# (the GPU host's image). Writes at most 8 flat files to $OUT (default /tmp/unmask-gpu-out):
#   gpu_run.log     everything printed
#   summary.md      the figures for docs/perf.md
#   check.json      unmask check-device: logits vs CPU, device sampler vs reference sampler
#   traces.json     CPU vs GPU decode comparisons (tokens and steps)
#   bench.json      unmask bench: SDAR-1.7B, all strategies, events on/off, ablations; every SDAR
#                   shape (1.7B, 4B, 8B, 30B-A3B); long caches (prompts of 512 to 32000 tokens)
#   torch.json      the PyTorch references (scripts/torch_reference.py): transformers eager at
#                   1.7B, and the compiled static-cache decoder at every dense shape
#   bandwidth.json  device-to-device copy bandwidth: every floor divides by it
#   gemv_bench.txt  scripts/gemv_bench.cu: the gemv kernel's designs against cuBLAS (nvcc; only
#                   with GEMV_BENCH=1)
# Every stage is guarded: a failing stage is reported and the next one still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
OUT=${OUT:-/tmp/unmask-gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_run.log") 2>&1
T0=$(date +%s)
W=$(mktemp -d)
BIN=$W/unmask
STATUS=()
stage() { echo; echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
record() { STATUS+=("$1: $2"); echo "--- $1: $2"; }
export PYTHONUNBUFFERED=1
# Overridable for a dry run on a CPU machine: DEVICE=cpu SHAPE=tiny TORCH_DEVICE=cpu NEW_TOKENS=16
NEW=${NEW_TOKENS:-256}
DEV=${DEVICE:-cuda}
SHAPE=${SHAPE:-sdar-1.7b}
TDEV=${TORCH_DEVICE:-cuda}

stage "setup"
unpack_unmask "$BIN" || exit 1
"$BIN" --version && record setup ok || record setup FAIL

stage "nvidia-smi"
gpu_info

stage "device copy bandwidth (torch)"
gpu_bandwidth "$OUT/bandwidth.json" && record bandwidth ok || record bandwidth FAIL

stage "check-device: logits vs CPU, device sampler vs reference (tests/fixtures/tiny-random)"
timeout 180 "$BIN" check-device --model tests/fixtures/tiny-random --device $DEV --json "$OUT/check.json" \
  && record check-device PASS || record check-device FAIL

stage "decode traces: CPU vs GPU (tiny-random, greedy and sampled)"
TR=$W/traces; mkdir -p "$TR"
M=tests/fixtures/tiny-random
run_trace() { # name env... -- args...
  local name=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  if env "${envs[@]}" timeout 60 "$BIN" trace --model $M --max-new-tokens 64 "$@" --out "$TR/$name.jsonl" 2> "$TR/$name.err"; then
    echo "trace $name: ok"
  else
    echo "trace $name: FAILED: $(tail -2 "$TR/$name.err")"
  fi
}
for strat in low_confidence_dynamic entropy_bounded low_confidence_static; do
  run_trace "cpu-$strat" X=1 -- --device cpu --strategy $strat
  run_trace "gpu-f32-$strat" X=1 -- --device $DEV --dtype f32 --strategy $strat
  run_trace "gpu-bf16-$strat" X=1 -- --device $DEV --strategy $strat
  run_trace "cpu-bf16-$strat" X=1 -- --device cpu --dtype bf16 --strategy $strat
done
S="--temperature 0.8 --top-k 20 --top-p 0.95 --seed 3"
run_trace cpu-sampled X=1 -- --device cpu $S
run_trace gpu-f32-sampled X=1 -- --device $DEV --dtype f32 $S
run_trace gpu-f32-nograph UNMASK_CUDA_GRAPH=0 -- --device $DEV --dtype f32
run_trace gpu-f32-eager UNMASK_FIXED_PASSES=0 -- --device $DEV --dtype f32
run_trace gpu-f32-hostsampler UNMASK_DEVICE_SAMPLER=0 -- --device $DEV --dtype f32
run_trace gpu-f32-generic UNMASK_FUSED=0 -- --device $DEV --dtype f32
run_trace cpu-default X=1 -- --device cpu
# packed weights against rows in bf16, required identical: tiny-random's shapes take the same
# splits either way (the same sums) and a 7-token prompt keeps every pass of 4-token blocks
# within the gemv's 8 rows; blocks of 8 lay the weights back in rows (Model::set_packed)
run_trace gpu-bf16-packed X=1 -- --device $DEV
run_trace gpu-bf16-rows UNMASK_PACKED=0 -- --device $DEV
run_trace gpu-bf16-b8 X=1 -- --device $DEV --block-length 8
run_trace gpu-bf16-b8-rows UNMASK_PACKED=0 -- --device $DEV --block-length 8
timeout 60 python3 - "$TR" "$OUT/traces.json" <<'EOF' && record traces PASS || record traces FAIL
import json, os, sys
tr, out = sys.argv[1], sys.argv[2]
def load(name):
    p = os.path.join(tr, name + ".jsonl")
    if not os.path.exists(p): return None
    ev = [json.loads(l) for l in open(p) if l.strip()]
    steps = [(e["block"], e["step"], [(c["pos"], c["token"]) for c in e["committed"]], [(c["pos"], c["token"]) for c in e["masked"]]) for e in ev if e["event"] == "step"]
    confs = [c["conf"] for e in ev if e["event"] == "step" for c in e["committed"]]
    fin = [e for e in ev if e["event"] == "finish"]
    return {"steps": steps, "confs": confs, "finish": fin[0] if fin else None}
def compare(a, b):
    A, B = load(a), load(b)
    if A is None or B is None: return {"a": a, "b": b, "same": False, "why": "missing trace"}
    same_steps = A["steps"] == B["steps"]
    first = next((i for i, (x, y) in enumerate(zip(A["steps"], B["steps"])) if x != y), None)
    fa, fb = A["finish"] or {}, B["finish"] or {}
    same_out = fa.get("output_ids") == fb.get("output_ids")
    dconf = max((abs(x - y) for x, y in zip(A["confs"], B["confs"])), default=0.0)
    return {"a": a, "b": b, "same": same_steps and same_out, "same_steps": same_steps, "same_output": same_out,
            "steps": (len(A["steps"]), len(B["steps"])), "first_divergent_step": first, "max_dconf": dconf,
            "forwards": (fa.get("forwards"), fb.get("forwards"))}
pairs = []
for s in ["low_confidence_dynamic", "entropy_bounded", "low_confidence_static"]:
    pairs += [(f"cpu-{s}", f"gpu-f32-{s}", True), (f"cpu-{s}", f"gpu-bf16-{s}", False), (f"cpu-bf16-{s}", f"gpu-bf16-{s}", False)]
pairs += [("cpu-sampled", "gpu-f32-sampled", True)]
pairs += [("cpu-default", n, True) for n in ["gpu-f32-nograph", "gpu-f32-eager", "gpu-f32-hostsampler", "gpu-f32-generic"]]
pairs += [("gpu-bf16-packed", "gpu-bf16-rows", True), ("gpu-bf16-b8", "gpu-bf16-b8-rows", True)]
res, ok = [], True
for a, b, must in pairs:
    r = compare(a, b); r["required"] = must; res.append(r)
    flag = "SAME" if r["same"] else ("DIFF" if must else "diff (bf16, informational)")
    print(f"{flag:28s} {a:28s} vs {b:28s} steps {r.get('steps')} first divergence {r.get('first_divergent_step')} max|dconf| {r.get('max_dconf', 0):.2e}")
    if must and not r["same"]: ok = False
json.dump(res, open(out, "w"), indent=2)
sys.exit(0 if ok else 1)
EOF

stage "unmask bench: SDAR-1.7B shape, B=4 S=4, batch 1, all strategies, events on/off"
BJ=$W/bench; mkdir -p "$BJ"
timeout 300 "$BIN" bench --random-init $SHAPE --device $DEV --prompt-len 64 --max-new-tokens "$NEW" \
  --block-length 4 --steps 4 --events both --warmup 1 --repeat 3 --json "$BJ/main.json" \
  && record bench ok || record bench FAIL

stage "unmask bench ablations (low_confidence_static, events off, 128 tokens): the default again, for comparison, and ABLATIONS (default: graphs off / PDL off / cuBLAS and the standard layer; also rows eager hostsampler cublasnopdl generic)"
ABLATIONS=${ABLATIONS:-default nograph nopdl cublas}
declare -A AB=([default]=UNMASK_ABLATION=default [rows]=UNMASK_PACKED=0
  [nograph]=UNMASK_CUDA_GRAPH=0 [eager]=UNMASK_FIXED_PASSES=0
  [hostsampler]=UNMASK_DEVICE_SAMPLER=0 [nopdl]=UNMASK_PDL=0 [cublas]=UNMASK_GEMV=0
  [cublasnopdl]="UNMASK_GEMV=0 UNMASK_PDL=0" [generic]=UNMASK_FUSED=0)
for name in $ABLATIONS; do
  set -- $name ${AB[$name]}
  name=$1; shift
  env "$@" timeout 150 "$BIN" bench --random-init $SHAPE --device $DEV --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events off --warmup 1 --repeat 2 --json "$BJ/$name.json" \
    && record "bench-$name" ok || record "bench-$name" FAIL
done
stage "every SDAR shape: unmask bench (static, events on, 128 tokens) beside the compiled PyTorch reference (static KV cache, torch.compile reduce-overhead), same algorithm"
TJ=$W/torch; mkdir -p "$TJ"
for shape in ${SHAPES:-sdar-1.7b sdar-4b sdar-8b sdar-30b-a3b}; do
  timeout 120 "$BIN" bench --random-init $shape --device $DEV --prompt-len 64 --max-new-tokens 128 \
    --strategy low_confidence_static --events on --warmup 1 --repeat 2 --json "$BJ/shape-$shape.json" \
    && record "bench-$shape" ok || record "bench-$shape" FAIL
  # the compiled MoE reference takes minutes to compile at 30B-A3B: COMPILED_SHAPES adds it
  if [[ " ${COMPILED_SHAPES:-sdar-1.7b sdar-4b sdar-8b} " == *" $shape "* ]]; then
    timeout 150 python3 scripts/torch_reference.py --shape $shape --compile --device $TDEV --prompt-len 64 --max-new-tokens 128 \
      --strategy low_confidence_static --warmup 1 --repeat 2 --json "$TJ/compiled-$shape.json" \
      && record "torch-compiled-$shape" ok || record "torch-compiled-$shape" FAIL
  fi
done

stage "long caches: SDAR-1.7B, prompts of 512 to 32000 tokens (split-K attention), 64 new tokens, events off"
for p in ${LONG:-512 4096 16384 32000}; do
  timeout 120 "$BIN" bench --random-init $SHAPE --device $DEV --prompt-len $p --max-new-tokens 64 \
    --strategy low_confidence_static --events off --warmup 1 --repeat 2 --json "$BJ/long-$p.json" \
    && record "bench-long-$p" ok || record "bench-long-$p" FAIL
done

python3 - "$BJ" "$OUT/bench.json" <<'EOF' || true
import json, os, sys
d = {}
for f in sorted(os.listdir(sys.argv[1])):
    try: d[f[:-5]] = json.load(open(os.path.join(sys.argv[1], f)))
    except Exception as e: d[f[:-5]] = {"error": str(e)}
json.dump(d, open(sys.argv[2], "w"), indent=2)
EOF

stage "gemv kernel designs vs cuBLAS (scripts/gemv_bench.cu, built here by nvcc)"
if [[ ${GEMV_BENCH:-0} != 0 ]]; then
  NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
  if [[ -n $NVCC ]] && "$NVCC" -O3 -arch=sm_90 -o "$W/gemv_bench" scripts/gemv_bench.cu -lcublas > "$OUT/gemv_bench.txt" 2>&1 \
     && timeout 180 "$W/gemv_bench" >> "$OUT/gemv_bench.txt" 2>&1; then
    record gemv-bench ok; grep -E "^(chain|best)" "$OUT/gemv_bench.txt"
  else
    record gemv-bench FAIL; tail -5 "$OUT/gemv_bench.txt" 2>/dev/null
  fi
fi

stage "PyTorch reference: transformers Qwen3ForCausalLM, SDAR-1.7B shape, same algorithm"
timeout 240 python3 scripts/torch_reference.py --shape $SHAPE --device $TDEV --prompt-len 64 --max-new-tokens "$NEW" \
  --strategy low_confidence_static --warmup 1 --repeat 2 --json "$TJ/eager.json" \
  && record torch ok || record torch FAIL
python3 - "$TJ" "$OUT/torch.json" <<'EOF' || true
import json, os, sys
d = {"compiled": {}}
for f in sorted(os.listdir(sys.argv[1])):
    try: r = json.load(open(os.path.join(sys.argv[1], f)))
    except Exception as e: r = {"error": str(e)}
    if f == "eager.json": d["eager"] = r
    else: d["compiled"][f[len("compiled-"):-5]] = r
json.dump(d, open(sys.argv[2], "w"), indent=2)
EOF

stage "summary"
python3 - "$OUT" "$SHAPE" <<'EOF' | tee "$OUT/summary.md"
import json, os, sys
o, SHAPE = sys.argv[1], sys.argv[2]
def j(n):
    try: return json.load(open(os.path.join(o, n)))
    except Exception: return None
bw, bench, torch_all, check, traces = j("bandwidth.json"), j("bench.json") or {}, j("torch.json") or {}, j("check.json"), j("traces.json")
torch_, compiled = torch_all.get("eager"), torch_all.get("compiled", {})
main = bench.get("main")
print("## unmask on the GPU: one run of scripts/gpu_run.sh\n")
if bw: print(f"- device: {bw['device']}; device-to-device copy bandwidth {bw['bytes_per_s']/1e12:.3f} TB/s (read + write, 4 GiB, median of 10)")
if check:
    n = len(check["checks"]); f = sum(not c["pass"] for c in check["checks"])
    print(f"- check-device: {n - f}/{n} checks pass (logits vs CPU f32, device sampler vs reference sampler)")
    for c in check["checks"]:
        if c["name"].startswith("logits"): print(f"  - {c['name']}: rel. error {c['value']:.2e} (limit {c['limit']:.0e})")
    for k, v in check.get("timings_us", []):
        if k.startswith("sampler"): print(f"  - {k}: {v:.1f} us per call ([4, 151936] bf16)")
    tm = dict(check.get("timings_us", []))
    shapes = {"qkv": (4096, 2048), "o": (2048, 2048), "gate_up": (12288, 2048), "down": (2048, 6144), "lm_head": (151936, 2048)}
    if any(k.startswith("gemv") for k in tm):
        print("\n  gemv kernel vs candle matmul (cuBLAS), bf16, weights cycled past L2, host-timed back to back (us per call, GB/s of weights):\n")
        print("  | projection | N x K | T | gemv us | gemv GB/s | cuBLAS us | cuBLAS GB/s |")
        print("  |---|---|---:|---:|---:|---:|---:|")
        for name, (n, k) in shapes.items():
            for t in [1, 4, 8]:
                g, m = tm.get(f"gemv {name} T={t}"), tm.get(f"matmul {name} T={t}")
                if g and m:
                    b = n * k * 2
                    print(f"  | {name} | {n} x {k} | {t} | {g:.1f} | {b/g/1e3:.0f} | {m:.1f} | {b/m/1e3:.0f} |")
        print()
if traces:
    req = [t for t in traces if t["required"]]
    print(f"- decode traces CPU vs GPU: {sum(t['same'] for t in req)}/{len(req)} required pairs identical (tokens, steps); bf16 pairs: " +
          ", ".join(f"{t['a']} vs {t['b']}: {'same' if t['same'] else 'differs from step ' + str(t['first_divergent_step'])}" for t in traces if not t["required"]))
if main and "rows" in main:
    wb = main["weight_bytes"]
    # The bytes a block pass reads (layers, final norm, lm_head, B embedding rows: `unmask
    # bench`'s pass_bytes), not the whole weight size.
    rb = main.get("floor", {}).get("denoise_bytes", wb)
    floor = rb / bw["bytes_per_s"] * 1e3 if bw else None
    print(f"\n### SDAR-1.7B shape (random bf16 weights, {wb/1e9:.2f} GB), prompt {main['prompt_len']}, {main['max_new_tokens']} new tokens, B={main['block_length']} S={main['steps']}, batch 1")
    if floor: print(f"HBM floor: {rb/1e9:.3f} GB read a pass / {bw['bytes_per_s']/1e12:.2f} TB/s = **{floor:.3f} ms per forward**\n")
    print(f"paths: {main['run']}\n")
    print("| strategy | events | ms/forward | x floor | denoise ms | +store ms | forwards/s | tok/s | tok/forward |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in main["rows"]:
        xf = f"{r['ms_per_forward']/floor:.2f}" if floor else "-"
        print(f"| {r['strategy']} | {r['events']} | {r['ms_per_forward']:.3f} | {xf} | {r['denoise_ms_median']:.3f} | {r['stored_ms_median']:.3f} | {r['forwards_per_s']:.1f} | {r['tokens_per_s']:.1f} | {r['tokens_per_forward']:.3f} |")
    print()
    for on in [r for r in main["rows"] if r["events"] == "on"]:
        off = next((r for r in main["rows"] if r["events"] == "off" and r["strategy"] == on["strategy"]), None)
        if off: print(f"- events cost, {on['strategy']}: {(on['decode_ms']/off['decode_ms']-1)*100:+.2f} % decode time (wall time on against off, separate decodes)")
        base = off["decode_ms"] if off else on["decode_ms"]
        print(f"  - their work, timed where it runs: building {on['event_build_ms']:.2f} ms on the engine thread = {on['event_build_ms']/base*100:.2f} % of the decode, "
              f"serialising {on['event_write_ms']:.2f} ms on the writer's = {on['event_write_ms']/base*100:.2f} %")
    for name in ["default", "plainattention", "carveoutnone", "nograph", "eager", "hostsampler", "nopdl", "cublas", "cublasnopdl", "generic"]:
        b = bench.get(name)
        if b and "rows" in b:
            r = b["rows"][0]
            print(f"- ablation {name}: {r['ms_per_forward']:.3f} ms/forward, {r['tokens_per_s']:.1f} tok/s (128 tokens, {b['run']})")
    if torch_:
        st = next((r for r in main["rows"] if r["strategy"] == "low_confidence_static" and r["events"] == "on"), None)
        print(f"\n### PyTorch reference (transformers {torch_['transformers']}, torch {torch_['torch']}, {torch_['attn']}, same algorithm, low_confidence_static)")
        print(f"- {torch_['ms_per_forward_median']:.2f} ms/forward (CUDA events), {torch_['wall_ms_per_forward']:.2f} ms/forward (wall), {torch_['tokens_per_s']:.1f} tok/s")
        if st: print(f"- unmask low_confidence_static, events on: {st['tokens_per_s']:.1f} tok/s = **{st['tokens_per_s']/torch_['tokens_per_s']:.1f}x** the PyTorch reference")
def floor_ms(b):
    rb = b.get("floor", {}).get("denoise_bytes")
    return rb / bw["bytes_per_s"] * 1e3 if (rb and bw) else None
shapes = [(k[len("shape-"):], v) for k, v in bench.items() if k.startswith("shape-") and "rows" in v]
if shapes:
    print("\n### Every SDAR shape: batch 1, B=4 S=4, low_confidence_static, events on, 128 new tokens after 64")
    print("floor = the bytes a pass reads (layers, final norm, lm_head, B embedding rows; a MoE pass's distinct experts counted) / the copy bandwidth above\n")
    print("| shape | bytes a pass reads | floor ms | unmask ms/forward | x floor | tok/s | compiled PyTorch ms/forward | unmask faster by |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, b in shapes:
        r, fl = b["rows"][0], floor_ms(b)
        c = compiled.get(name)
        cms = c.get("ms_per_forward_median") if isinstance(c, dict) else None
        xf, fls = (f"{r['ms_per_forward']/fl:.2f}", f"{fl:.3f}") if fl else ("-", "-")
        print(f"| {name} | {b['floor']['denoise_bytes']/1e9:.3f} GB | {fls} | {r['ms_per_forward']:.3f} | {xf} | {r['tokens_per_s']:.1f} | "
              + (f"{cms:.3f} | {cms/r['ms_per_forward']:.2f}x |" if cms else "- | - |"))
longs = sorted(((int(k[len("long-"):]), v) for k, v in bench.items() if k.startswith("long-") and "rows" in v))
if longs:
    base = longs[0][1]["rows"][0]["ms_per_forward"]
    print(f"\n### Long caches: {SHAPE} shape, 64 new tokens, static, events off (floor: the weights and the K/V a pass reads)\n")
    print(f"| prompt | ms/forward | x the {longs[0][0]}-token time | floor ms | x floor |")
    print("|---:|---:|---:|---:|---:|")
    for p, b in longs:
        r, fl = b["rows"][0], floor_ms(b)
        print(f"| {p} | {r['ms_per_forward']:.3f} | {r['ms_per_forward']/base:.2f} | " + (f"{fl:.3f} | {r['ms_per_forward']/fl:.2f} |" if fl else "- | - |"))
EOF
echo
echo "stages: ${STATUS[*]}"
echo "total $(( $(date +%s) - T0 )) s; files in $OUT:"; ls -l "$OUT"
rm -rf "$W"
sleep 1  # let tee flush gpu_run.log
