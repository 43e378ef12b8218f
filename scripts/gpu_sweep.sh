#!/usr/bin/env bash
# A/B of settings (environment switches) of one binary on the GPU host, in one call: every
# setting is run in turn, ROUNDS times, alternating, so drift during the call falls on all of
# them; the median per setting and token count is printed at the end.
#
#   OUT=/tmp/s bash scripts/gpu_sweep.sh "pdl:UNMASK_PDL=1" "nopdl:UNMASK_PDL=0"
#
# A setting is NAME:VAR=V[,VAR=V...] (NAME alone: the defaults). Environment, all optional:
#   ROUNDS (3), TOKENS ("128 256"), SHAPE (sdar-1.7b), STRATEGY (low_confidence_static),
#   CHECK=1: unmask check-device first (tests/fixtures/tiny-random; check.json),
#   UNMASK_GZ (.gpu/unmask.gz). Writes sweep.log, sweep.tsv (and check.json) to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/unmask-sweep}
mkdir -p "$OUT"
exec > >(tee "$OUT/sweep.log") 2>&1
W=$(mktemp -d)
BIN=$W/unmask
gunzip -c "${UNMASK_GZ:-.gpu/unmask.gz}" > "$BIN" && chmod +x "$BIN" || { echo "no binary: run scripts/build-cuda.sh"; exit 1; }
SHAPE=${SHAPE:-sdar-1.7b}
if [[ ${CHECK:-0} == 1 ]]; then
  timeout 180 "$BIN" check-device --model tests/fixtures/tiny-random --device cuda --json "$OUT/check.json" > "$W/check.txt" 2>&1 \
    && echo "check-device: PASS" || { echo "check-device: FAIL"; tail -20 "$W/check.txt"; }
  python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['checks']; print(f'checks passing: {sum(x[\"pass\"] for x in c)}/{len(c)}')" "$OUT/check.json" || true
fi
printf 'setting\ttokens\tround\tms_per_forward\n' > "$OUT/sweep.tsv"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for setting in "$@"; do
    name=${setting%%:*}
    vars=()
    [[ $setting == *:* ]] && IFS=, read -ra vars <<< "${setting#*:}"
    for tokens in ${TOKENS:-128 256}; do
      json=$W/$name-$tokens-$round.json
      if env "${vars[@]}" timeout 120 "$BIN" bench --random-init "$SHAPE" --device cuda --prompt-len 64 \
          --max-new-tokens "$tokens" --block-length 4 --steps 4 --strategy "${STRATEGY:-low_confidence_static}" \
          --events off --warmup 1 --repeat 3 --json "$json" > "$W/bench.txt" 2>&1; then
        ms=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(f\"{r['ms_per_forward']:.4f}\")" "$json" 2>/dev/null || echo "?")
      else
        ms=FAIL; tail -3 "$W/bench.txt"
      fi
      printf '%s\t%s\t%s\t%s\n' "$name" "$tokens" "$round" "$ms" | tee -a "$OUT/sweep.tsv"
    done
  done
done
python3 - "$OUT/sweep.tsv" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
by = {}
for name, tokens, _, ms in rows:
    try: by.setdefault((name, tokens), []).append(float(ms))
    except ValueError: pass
print("\nsetting  tokens  median ms/forward  (all)")
for (name, tokens), v in by.items():
    print(f"{name:24s} {tokens:>5s}  {statistics.median(v):.4f}  ({', '.join(f'{x:.3f}' for x in v)})")
EOF
