#!/usr/bin/env bash
# Session 23, call 2 (warm H100): the timeline of both router forms; moe_bench 9 dense's o and q|k|v rows
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name --format=csv,noheader
for r in split cluster; do
  OUT=$OUT SHAPE=sdar-30b-a3b bash scripts/gpu_timeline.sh UNMASK_MOE_ROUTER=$r > /dev/null 2>&1
  echo "== $r"; sed -n 3,16p $OUT/timeline-sdar_30b_a3b_UNMASK_MOE_ROUTER_$r.md
done
rm -f $OUT/*.bench.txt $OUT/*.kernels.txt
nvcc -O3 -arch=sm_90 -o /tmp/mb scripts/moe_bench.cu && timeout 200 /tmp/mb 9 dense > $OUT/moe_bench-9-dense.txt 2>&1
sed -n '/router (norm)/,$p' $OUT/moe_bench-9-dense.txt | grep -v rows
