# shellcheck shell=bash
# What the GPU-host scripts share (gpu_run.sh, gpu_profile.sh source it from
# the repo root): unpacking the binary so that it starts, the GPU's identity, and the copy
# bandwidth that every floor in docs/perf.md is divided by.

# Unpacks ${UNMASK_GZ:-.gpu/unmask.gz} (scripts/build-cuda.sh) to $1, and where the loader cannot
# find a library the binary links (libcuda.so.1, libcublas(Lt).so.13, libcurand.so.10,
# libnvrtc.so.13), adds the usual CUDA and Python-wheel folders to LD_LIBRARY_PATH: the build
# machine linked against stubs, so the host's own copies must be found. Fails with no archive.
unpack_unmask() {
  local bin=$1 gz=${UNMASK_GZ:-.gpu/unmask.gz} missing dirs
  if ! gunzip -c "$gz" > "$bin"; then echo "no $gz: run scripts/build-cuda.sh first"; return 1; fi
  chmod +x "$bin"
  ls -l "$bin"
  missing=$(ldd "$bin" | awk '/not found/{print $1}')
  [[ -z $missing ]] && return 0
  echo "not found by the loader: $missing"
  dirs=$(python3 - <<'EOF' 2>/dev/null
import glob, os, site
roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64"]
for sp in site.getsitepackages():
    roots += glob.glob(os.path.join(sp, "nvidia", "*", "lib")) + glob.glob(os.path.join(sp, "nvidia", "cu13", "lib"))
print(":".join(r for r in roots if os.path.isdir(r)))
EOF
)
  export LD_LIBRARY_PATH=${dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  ldd "$bin" | grep -E "not found|cublas|nvrtc|curand|libcuda" || true
}

# The GPU, its driver and clocks, for the log.
gpu_info() {
  nvidia-smi || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
}

# Device-to-device copy bandwidth by torch (4 GiB, median of 10 copies, bytes read + written)
# into the JSON file $1; fails if torch or the GPU does.
gpu_bandwidth() {
  timeout 120 python3 - "$1" <<'EOF'
import json, sys, torch
n = 4 << 30  # 4 GiB source, 4 GiB destination
a = torch.empty(n, dtype=torch.uint8, device="cuda"); a.random_(0, 255)
b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
times = []
for _ in range(10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize()
    times.append(s.elapsed_time(e))
times.sort()
ms = times[len(times) // 2]
bw = 2 * n / (ms / 1e3)  # bytes read + written
print(f"copy {n/2**30:.0f} GiB: median {ms:.3f} ms -> {bw/1e12:.3f} TB/s (read + write)")
json.dump({"bytes": n, "median_ms": ms, "bytes_per_s": bw, "all_ms": times, "device": torch.cuda.get_device_name()}, open(sys.argv[1], "w"), indent=2)
EOF
}
