set -uo pipefail
OUT=$OUT SHAPE=sdar-1.7b LAUNCHES=400 bash scripts/gpu_profile.sh 2>&1 | tail -22
mv $OUT/ncu-default.csv $OUT/ncu-sdar-1.7b.csv
OUT=$OUT SHAPE=sdar-30b-a3b FILTER=unmask_ SKIP=6000 LAUNCHES=450 bash scripts/gpu_profile.sh 2>&1 | tail -16
mv $OUT/ncu-default.csv $OUT/ncu-sdar-30b-a3b.csv
