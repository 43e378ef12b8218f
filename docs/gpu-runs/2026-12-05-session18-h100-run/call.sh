set -uo pipefail
OUT=$OUT bash scripts/gpu_run.sh > /dev/null 2>&1; echo "gpu_run rc=$?"
tail -60 $OUT/summary.md 2>/dev/null || tail -40 $OUT/gpu_run.log
grep -E "^--- " $OUT/gpu_run.log | head -60
OUT=/tmp/prof SHAPE=sdar-1.7b PROMPT=32000 FILTER='attention_(split|merge)' SKIP=0 LAUNCHES=112 bash scripts/gpu_profile.sh 2>&1 | tail -4
