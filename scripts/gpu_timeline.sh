#!/usr/bin/env bash
# Where a forward's time goes *inside the CUDA graph*, on the GPU host.
#
#   SHAPE=sdar-30b-a3b bash scripts/gpu_timeline.sh [ENV=VALUE ...]
#
# ncu (scripts/gpu_profile.sh) times each kernel alone, caches flushed, so it cannot say what a
# kernel costs in the chain, where programmatic dependent launch overlaps each kernel's start
# with its predecessor's tail. This records every kernel of a bench decode, graph nodes
# included, by CUPTI (scripts/cupti_timeline.c, loaded through CUDA_INJECTION64_PATH; the host
# has no Nsight Systems) and, over the last WINDOW (default 20000) kernels, prints per kernel
# name: launches, mean duration (start to end, waiting included) and mean *marginal* time, its
# end minus the previous kernel's end: what it adds to the critical path. The marginals sum to
# the window's time between kernel ends. Then one layer's kernels, averaged over the window's
# layers, with when each starts and ends. Needs .gpu/unmask.gz, .gpu/timeline.so and
# .gpu/libcupti.so.13.gz, all three made by scripts/build-cuda.sh (carry them to the host).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
OUT=${OUT:-/tmp/unmask-gpu-out}
mkdir -p "$OUT"
W=$(mktemp -d)
BIN=$W/unmask
unpack_unmask "$BIN" > /dev/null || exit 1
[[ -f .gpu/timeline.so ]] || { echo "no .gpu/timeline.so: run scripts/build-cuda.sh first"; exit 1; }
gunzip -c .gpu/libcupti.so.13.gz > "$W/libcupti.so.13" 2>/dev/null
tag=${SHAPE:-sdar-30b-a3b}${*:+-$*}; tag=${tag//[^A-Za-z0-9.]/_}
env "$@" LD_LIBRARY_PATH="$W${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" CUDA_INJECTION64_PATH="$PWD/.gpu/timeline.so" \
  TIMELINE_OUT="$W/kernels.txt" timeout 300 \
  "$BIN" bench --random-init "${SHAPE:-sdar-30b-a3b}" --device cuda --prompt-len "${PROMPT:-64}" --max-new-tokens 64 \
  --strategy low_confidence_static --events on --warmup 0 --repeat 1 > "$OUT/timeline-$tag.bench.txt" 2>&1
echo "bench rc=$?, $(wc -l < "$W/kernels.txt") kernels recorded"
sort -n -k2 "$W/kernels.txt" | tail -n 3000 > "$OUT/timeline-$tag.kernels.txt"
python3 - "$W/kernels.txt" "${WINDOW:-20000}" > "$OUT/timeline-$tag.md" <<'PY'
import sys, collections
ks = []
for line in open(sys.argv[1]):
    s, e, node, name = line.rstrip("\n").split(" ", 3)
    ks.append((int(s), int(e), name.split("(")[0].split("<")[0][:60]))
ks.sort(key=lambda k: k[1])  # by end: the critical path's order
ks = ks[-int(sys.argv[2]):]
dur, marg, cnt = collections.Counter(), collections.Counter(), collections.Counter()
for (s, e, n), (_, pe, _) in zip(ks[1:], ks[:-1]):
    dur[n] += e - s; marg[n] += e - pe; cnt[n] += 1
wall = ks[-1][1] - ks[0][1]
print(f"{len(ks) - 1} kernels, {wall / 1e3:.1f} us between the first's end and the last's")
print("| kernel | launches | mean duration us | mean marginal us | marginal share |")
print("|---|---:|---:|---:|---:|")
for n, m in marg.most_common(30):
    print(f"| {n} | {cnt[n]} | {dur[n] / cnt[n] / 1e3:.2f} | {m / cnt[n] / 1e3:.2f} | {100 * m / wall:.1f} % |")
# One layer, averaged: the kernels from the one before each attention kernel (q|k|v) to the one
# before the next layer's, in launch order, each start and end in us from the end of the kernel
# before the layer (the previous layer's last), over the layers whose kernels and predecessor
# are the most common (the first layer after the embedding and the last before the lm_head fall
# out): when a kernel starts says whether its blocks were resident, waiting, while the kernels
# before it ran.
ks.sort(key=lambda k: k[0])
at = [i for i, k in enumerate(ks) if "attention" in k[2] and i >= 2]
layers = collections.defaultdict(list)
for a, b in zip(at, at[1:]):
    ref, body = ks[a - 2], ks[a - 1:b - 1]
    layers[(ref[2],) + tuple(k[2] for k in body)].append([(k[0] - ref[1], k[1] - ref[1]) for k in body])
if layers:
    key, runs = max(layers.items(), key=lambda kv: len(kv[1]))
    print(f"\nOne layer, averaged over {len(runs)} (us from the end of the kernel before it, {key[0]}):\n")
    print("| kernel | start | end |")
    print("|---|---:|---:|")
    for j, n in enumerate(key[1:]):
        print(f"| {n} | {sum(r[j][0] for r in runs) / len(runs) / 1e3:.2f} | {sum(r[j][1] for r in runs) / len(runs) / 1e3:.2f} |")
PY
cat "$OUT/timeline-$tag.md"
grep -E "low_confidence" "$OUT/timeline-$tag.bench.txt" | head -3
