#!/usr/bin/env bash
# Build `unmask --features cuda` on a machine with no CUDA toolkit and no GPU, for a Hopper GPU
# host (CUDA 13.0, driver 580, sm_90). Idempotent: re-running only rebuilds what changed.
#
#   bash scripts/build-cuda.sh            # -> .gpu/unmask.gz (stripped, gzip'ed release binary)
#
# Environment (all optional):
#   CUDA_TOOLKIT_DIR  where the PyPI NVIDIA wheels are installed
#                     (default ${XDG_CACHE_HOME:-$HOME/.cache}/unmask/cuda-toolkit)
#   CARGO_TARGET_DIR  cargo's target folder                       (default: the repo's target/)
#   CUDA_COMPUTE_CAP  GPU arch for candle's kernels               (default 90 = Hopper: H100, H200)
#   PYTHON            python used to pip-install the wheels        (default python3)
#
# What it does (see docs/gpu.md):
#  1. pip-installs nvcc + headers + the link-time libraries from PyPI's NVIDIA wheels (CUDA 13.0.x,
#     matching the GPU host's driver) into $CUDA_TOOLKIT_DIR/site (outside the repo);
#  2. makes $CUDA_TOOLKIT_DIR/lib: unversioned symlinks (libcublas.so -> libcublas.so.13, ...) and a
#     stub libcuda.so (soname libcuda.so.1) defining every cu* symbol cudarc declares. The binary
#     links against these; on the GPU host the real libcuda.so.1 / libcublas.so.13 are loaded;
#  3. cargo build --release --features cuda with LIBRARY_PATH (not RUSTFLAGS -L: that would change
#     fingerprints and rebuild candle's kernels, ~11 min on 2 cores);
#  4. strips and gzips the binary to .gpu/unmask.gz (ignored by git; carried to the GPU run);
#  5. builds scripts/cupti_timeline.c into .gpu/timeline.so and gzips CUPTI beside it
#     (.gpu/libcupti.so.13.gz), for scripts/gpu_timeline.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TK=${CUDA_TOOLKIT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/unmask/cuda-toolkit}
PY=${PYTHON:-python3}
SITE=$TK/site
CU=$SITE/nvidia/cu13
LIB=$TK/lib

WHEELS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cublas==13.0.2.14
  nvidia-curand==10.4.0.35
  nvidia-cuda-cupti==13.0.85
)

# 1. toolkit from wheels
stamp=$TK/.wheels-$(printf '%s\n' "${WHEELS[@]}" | md5sum | cut -c1-12)
if [[ ! -f $stamp ]]; then
  echo "== installing CUDA 13.0 wheels into $SITE"
  mkdir -p "$SITE"
  "$PY" -m pip install -q --no-deps --upgrade --target "$SITE" "${WHEELS[@]}"
  touch "$stamp"
fi
[[ -x $CU/bin/nvcc ]] || { echo "nvcc not found at $CU/bin/nvcc" >&2; exit 1; }

# 2. link folder: unversioned symlinks + stub libcuda
mkdir -p "$LIB"
for so in "$CU"/lib/lib*.so.*; do
  base=$(basename "$so")
  name=${base%%.so.*}.so
  ln -sf "$so" "$LIB/$name"
done
# also make the versioned names visible (libcublas.so.13 needs libcublasLt.so.13 at link time)
for so in "$CU"/lib/lib*.so.*; do ln -sf "$so" "$LIB/$(basename "$so")"; done
if [[ ! -f $LIB/libcuda.so ]]; then
  echo "== generating stub libcuda.so"
  # The stub's symbol list comes from cudarc's sources: a fresh machine must fetch them first.
  cargo fetch --locked -q
  reg=${CARGO_HOME:-$HOME/.cargo}/registry/src
  sys=$(ls -d "$reg"/*/cudarc-0.19.*/src/driver/sys/mod.rs | tail -1)
  grep -oE '^\s+fn cu[A-Za-z0-9_]+\(' "$sys" | sed -E 's/^\s+fn (cu[A-Za-z0-9_]+)\(/\1/' | sort -u \
    | awk '{print "int " $1 "(void) { return 999; }"}' > "$TK/libcuda_stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$LIB/libcuda.so" "$TK/libcuda_stub.c"
  ln -sf libcuda.so "$LIB/libcuda.so.1"
fi

# 3. build
export PATH=$CU/bin:$PATH CUDA_HOME=$CU CUDA_PATH=$CU
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export CUDARC_CUDA_VERSION=13000
export LIBRARY_PATH=$LIB${LIBRARY_PATH:+:$LIBRARY_PATH}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
echo "== cargo build --release --features cuda (target $TARGET, sm_$CUDA_COMPUTE_CAP, nvcc $(nvcc --version | grep -o 'release [0-9.]*'))"
CARGO_TARGET_DIR=$TARGET cargo build --release --locked --features cuda --bin unmask

# 4. package
mkdir -p .gpu
cp "$TARGET/release/unmask" .gpu/unmask
strip .gpu/unmask 2>/dev/null || true
gzip -9 -f .gpu/unmask
ls -l .gpu/unmask.gz
echo "== done: .gpu/unmask.gz ($(du -h .gpu/unmask.gz | cut -f1))"

# 5. the kernel timeline's CUPTI library (scripts/gpu_timeline.sh)
gcc -O2 -Wall -shared -fPIC -I"$CU/include" -o .gpu/timeline.so scripts/cupti_timeline.c -L"$CU/lib" -l:libcupti.so.13
gzip -9 -c "$CU/lib/libcupti.so.13" > .gpu/libcupti.so.13.gz
echo "== done: .gpu/timeline.so, .gpu/libcupti.so.13.gz"
