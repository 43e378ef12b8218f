#!/usr/bin/env python3
"""Compile kernels/*.cu with NVRTC, as the binary does at run time, on a machine with no GPU.

    python3 scripts/nvrtc_check.py [path/to/libnvrtc.so.13]

Without an argument it takes the libnvrtc that scripts/build-cuda.sh installed: under
$CUDA_TOOLKIT_DIR, default ${XDG_CACHE_HOME:-$HOME/.cache}/unmask/cuda-toolkit.

The CUDA binary compiles its kernels with NVRTC when it first needs them, so a kernel that nvcc
accepts but NVRTC does not (no system headers there, other defaults) would only fail on the GPU
host. This runs the same compilations (sources, headers and options as src/model/cuda/*.rs and
src/sampler/cuda.rs pass them) against the libnvrtc of scripts/build-cuda.sh's wheels and
prints each program's log. Exit status 1 if any fails.
"""
import ctypes, os, pathlib, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOLKIT = os.environ.get("CUDA_TOOLKIT_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "unmask", "cuda-toolkit")
LIB = sys.argv[1] if len(sys.argv) > 1 else os.path.join(TOOLKIT, "site/nvidia/cu13/lib/libnvrtc.so.13")
# libnvrtc dlopens its builtins by soname: load them from the same folder first
ctypes.CDLL(os.path.join(os.path.dirname(LIB), "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
nv = ctypes.CDLL(LIB)

# (file, options): what the launchers pass (compute_90 is what an H200 gets; compute_80 and the
# default are the fallbacks for older GPUs)
JOBS = [
    ("fused.cu", ["--gpu-architecture=compute_90"]),
    ("fused.cu", ["--gpu-architecture=compute_80"]),
    ("fused.cu", []),
    ("gemv.cu", ["--gpu-architecture=compute_90"]),
    ("gemv.cu", ["--gpu-architecture=compute_80"]),
    ("sampler.cu", ["--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"]),
]

# The named headers src/model/cuda/nvrtc.rs hands to NVRTC with the model's kernels (the
# sampler's program, compiled by src/sampler/cuda.rs, gets none)
HEADERS = ["common.cuh", "moe.cuh"]

failed = 0
for name, opts in JOBS:
    src = (ROOT / "kernels" / name).read_bytes()
    heads = [] if name == "sampler.cu" else HEADERS
    bodies = (ctypes.c_char_p * len(heads))(*[(ROOT / "kernels" / h).read_bytes() for h in heads])
    names = (ctypes.c_char_p * len(heads))(*[h.encode() for h in heads])
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), len(heads), bodies, names) == 0
    argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = nv.nvrtcCompileProgram(prog, len(opts), argv)
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace").strip()
    print(f"{name} {' '.join(opts) or '(default options)'}: {'ok' if rc == 0 else f'FAILED (nvrtc {rc})'}")
    if text:
        print("  " + text.replace("\n", "\n  "))
    failed += rc != 0
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
sys.exit(1 if failed else 0)
