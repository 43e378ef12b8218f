// What the GPU microbenchmarks (scripts/gemv_bench.cu, moe_bench.cu, persist_bench.cu) share: a
// CUDA call checked, a fill of deterministic bf16 noise, the largest relative difference of two
// bf16 buffers. Include after kernels/gemv.cu (to_bf16).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e = (x);                                                                    \
        if (e != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

typedef unsigned short bf;

// p[i] uniform in [-scale/2, scale/2), a hash of i and the seed, rounded to bf16.
__global__ void fill(bf* p, long n, unsigned seed, float scale) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        p[i] = to_bf16(((h & 0xffff) / 65535.0f - 0.5f) * scale);
    }
}

// A launch of `grid` x `block` with `smem` bytes of dynamic shared memory on `st`, under
// programmatic dependent launch when `pdl`; `attr` holds the attribute until the launch.
static cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, bool pdl, cudaStream_t st,
                                        cudaLaunchAttribute* attr) {
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = st;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    c.attrs = attr;
    c.numAttrs = pdl ? 1 : 0;
    return c;
}

// The largest |a - b| / (|b| + 0.01) over two device buffers of n bf16 values (b: the reference).
static double max_rel(const bf* a_d, const bf* b_d, long n) {
    std::vector<bf> a(n), b(n);
    CK(cudaMemcpy(a.data(), a_d, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), b_d, n * 2, cudaMemcpyDeviceToHost));
    auto f = [](bf v) {
        unsigned u = ((unsigned)v) << 16;
        float r;
        memcpy(&r, &u, 4);
        return r;
    };
    double m = 0;
    for (long i = 0; i < n; ++i) m = fmax(m, fabs(f(a[i]) - f(b[i])) / (fabs(f(b[i])) + 1e-2));
    return m;
}
