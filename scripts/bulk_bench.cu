// Does a gemv that streams its weights with the Hopper bulk-copy engine (cp.async.bulk into a
// ring of shared-memory stages) move them faster than kernels/gemv.cu's register batches?
//
//   nvcc -O3 -arch=sm_90 -o /tmp/bulk_bench scripts/bulk_bench.cu && /tmp/bulk_bench
//   GEMV_SHAPE=4b /tmp/bulk_bench    # or 8b (default 1.7b)
//
// Why (docs/perf.md, session 12): the kernel's warps each load U steps of W into registers, then
// wait for them, then multiply: 8 KiB a warp in flight at most, nothing while it multiplies, so a
// projection streams at 2.5-3.1 TB/s against a copy bandwidth of 4.2. Here one thread of a block
// hands the copy engine whole rows of W (one `cp.async.bulk` a row and stage, 1 KiB each) for S
// stages ahead, so S x 16 KiB are in flight a block whatever the warps are doing, and under
// programmatic dependent launch a block asks for all S stages before it waits for the kernel
// before it (weights are never written), so the next projection streams while the small kernels
// before it run. The warps multiply a stage from shared memory with the same mma.sync fragment
// order as the kernel (mma() of kernels/gemv.cu), each a quarter of the stage's k, and hand the
// stage back at a block barrier; the four quarters of a tile are summed in shared memory.
//
// A block owns a contiguous run of 16-row tiles (grid = SMs x blocks a SM), and walks its items
// (tile, 512-k chunk) in order; stage s of item i waits on mbarrier s at parity (i / S) & 1.
// Rows in shared memory are 1024 + 64 bytes apart, so the 8 lanes of a 128-byte phase (rows g,
// g + 1, 16-byte k slots q) fall in distinct banks.
//
// Prints, for T = 4: per projection (28 launches of one kind in a CUDA graph) the kernel at the
// model's split and the bulk kernel at S = 4, 6, 8, with and without PDL; then the forward's
// chain (28 x q|k|v, o, gate|up, down; plain forms) under PDL, alone and with an 11 us stand-in
// for q/k prep + attention after q|k|v, both kernels; and the device's copy bandwidth, all in the
// same run. Checks every bulk result against the kernel (the sums' order differs: relative
// difference under 2e-2 of bf16 outputs, as gemv_bench.cu allows against cuBLAS); exit 1 if not.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../kernels/gemv.cu"

#include "bench_common.cuh"

#define BK 512          // k a stage (a multiple of 4 warps x 32; divides every SDAR K)
#define ROWB (2 * BK + 64)  // bytes a row takes in a stage, padded against bank conflicts
#define STAGE (16 * ROWB)   // one stage: 16 rows

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Arrive once and tell the barrier `bytes` more will land through the copy engine.
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// Item i of a block: tile t0 + i / chunks, chunk i % chunks. Ask for its 16 rows' chunk.
__device__ __forceinline__ void issue(const unsigned short* w, int k, int t0, int chunks, int i, unsigned stage,
                                      unsigned bar) {
    const int tile = t0 + i / chunks, c = i % chunks;
    mbar_expect(bar, 16 * 2 * BK);
    const unsigned short* src = w + (long)tile * 16 * k + (long)c * BK;
    for (int r = 0; r < 16; ++r) bulk_copy(stage + r * ROWB, src + (long)r * k, 2 * BK, bar);
}

// y [t_len, n] = x [t_len, k] . W^T; n % 16 == 0, k % BK == 0 (the launcher checks). 128 threads.
template <int S>
__global__ void __launch_bounds__(128) gemv_bulk(const unsigned short* __restrict__ w, const unsigned short* x,
                                                 unsigned short* __restrict__ y, int t_len, int n, int k) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) unsigned long long bars[S];
    __shared__ float red[2][4][4][32];  // [tile parity][warp][c][lane]
    launch_dependents();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int tiles = n / 16, chunks = k / BK;
    // this block's tiles [t0, t1): contiguous, within one of every other block's count
    const int t0 = (int)((long)tiles * blockIdx.x / gridDim.x), t1 = (int)((long)tiles * (blockIdx.x + 1) / gridDim.x);
    const int items = (t1 - t0) * chunks;
    const unsigned base = smem_addr(sm), bar0 = smem_addr(bars);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) mbar_init(bar0 + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        // W is never written by a kernel: ask for it before waiting for the one before
        for (int i = 0; i < S && i < items; ++i) issue(w, k, t0, chunks, i, base + i * STAGE, bar0 + 8 * i);
    }
    __syncthreads();
    dependency_wait();  // x is the previous kernel's output
    const bool live = g < t_len;
    const unsigned short* xg = x + (long)(live ? g : 0) * k + 8 * q;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < items; ++i) {
        const int s = i % S, tl = i / chunks, ch = i % chunks;
        mbar_wait(bar0 + 8 * s, (i / S) & 1);
        const unsigned char* st = sm + s * STAGE;
        // this warp's quarter of the chunk: 4 steps of 32 k
#pragma unroll
        for (int j = 0; j < BK / 32 / 4; ++j) {
            const int kk = (warp * (BK / 4 / 32) + j) * 32;  // k within the chunk
            const uint4 a = *(const uint4*)(st + g * ROWB + 2 * (kk + 8 * q));
            const uint4 b = *(const uint4*)(st + (g + 8) * ROWB + 2 * (kk + 8 * q));
            const uint4 xv = live ? *(const uint4*)(xg + (long)ch * BK + kk) : zero;
            mma(c, a, b, xv.x, xv.y, false);
            mma(c, a, b, xv.z, xv.w, true);
        }
        const bool last = ch == chunks - 1;
        if (last)
#pragma unroll
            for (int e = 0; e < 4; ++e) red[tl & 1][warp][e][lane] = c[e];
        __syncthreads();  // every warp is done with stage s (and has written its sums)
        if (threadIdx.x == 0 && i + S < items) issue(w, k, t0, chunks, i + S, base + s * STAGE, bar0 + 8 * s);
        if (last) {
            if (warp == 0)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float v = red[tl & 1][0][e][lane] + red[tl & 1][1][e][lane] + red[tl & 1][2][e][lane] +
                                    red[tl & 1][3][e][lane];
                    const int row = (t0 + tl) * 16 + g + (e >> 1) * 8, t = 2 * q + (e & 1);
                    if (t < t_len) y[(long)t * n + row] = to_bf16(v);
                }
#pragma unroll
            for (int e = 0; e < 4; ++e) c[e] = 0.f;
        }
    }
}

typedef void (*BulkFn)(const unsigned short*, const unsigned short*, unsigned short*, int, int, int);

static int T = 4, SMS = 132;

static cudaError_t launch_bulk(int S, int per_sm, const bf* w, const bf* x, bf* y, int n, int k, bool pdl, cudaStream_t st) {
    if (n % 16 || k % BK) {
        fprintf(stderr, "bulk: n %d k %d not multiples of 16, %d\n", n, k, BK);
        exit(2);
    }
    BulkFn f = S == 4 ? gemv_bulk<4> : S == 6 ? gemv_bulk<6> : gemv_bulk<8>;
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t lc = launch_config(dim3(SMS * per_sm), dim3(128), (size_t)S * STAGE, pdl, st, &at);
    return cudaLaunchKernelEx(&lc, f, (const unsigned short*)w, (const unsigned short*)x, (unsigned short*)y, T, n, k);
}

// kernels/gemv.cu's plain form at the model's split (bench_common.cuh, gemv_split)
static cudaError_t launch_kernel(const bf* w, const bf* x, bf* y, int n, int k, bool pdl, cudaStream_t st) {
    const Split s = gemv_split(n, k, false);
    const int tiles = (n + 15) / 16;
    const size_t smem = std::max((size_t)T * (k / 8 + 1) * 16, s.ks > 1 ? (size_t)s.ks * s.tb * 4 * 32 * 4 : 0);
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t lc = launch_config(dim3((tiles + s.tb - 1) / s.tb), dim3(32 * s.ks * s.tb), smem, pdl, st, &at);
    auto f = s.u == 8 ? unmask_gemv_u8 : unmask_gemv_u4;
    return cudaLaunchKernelEx(&lc, f, (const uint4*)w, (const uint4*)x, (unsigned short*)y, (const unsigned short*)nullptr,
                              T, n, k / 8, s.ks, 1e-6f);
}

// The device's copy bandwidth (read + write of 1 GiB, counted once each), as scripts/gpu_run.sh's floor.
static double copy_tbs(cudaStream_t st) {
    const size_t bytes = 1ul << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    float us = capture_and_time(st, [&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st)); }, 10);
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * bytes / (us * 1e-6) / 1e12;
}

int main() {
    const Shape S = bench_shape();
    const int L = S.layers, QKV = S.q + 2 * S.kv;
    struct Proj {
        const char* name;
        int n, k;
    } P[4] = {{"qkv", QKV, S.hidden}, {"o", S.hidden, S.q}, {"gate_up", 2 * S.inter, S.hidden}, {"down", S.hidden, S.inter}};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    SMS = prop.multiProcessorCount;
    printf("shape SDAR-%s, device %s, %d SMs, T = %d\n", S.name, prop.name, SMS, T);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (auto f : {unmask_gemv_u4, unmask_gemv_u8})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
    for (BulkFn f : {gemv_bulk<4>, gemv_bulk<6>, gemv_bulk<8>})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * STAGE));
    std::vector<bf*> W[4];
    double layer_bytes = 0;
    long maxn = 0;
    for (int p = 0; p < 4; ++p) {
        layer_bytes += 2.0 * P[p].n * P[p].k;
        maxn = std::max(maxn, (long)std::max(P[p].n, P[p].k));
        for (int l = 0; l < L; ++l) {
            bf* w;
            CK(cudaMalloc(&w, 2L * P[p].n * P[p].k));
            fill<<<1024, 256>>>(w, (long)P[p].n * P[p].k, 1234u + 97u * p + 7919u * l, 0.25f);
            W[p].push_back(w);
        }
    }
    bf *x, *y, *ref, *io[4];
    CK(cudaMalloc(&x, 2L * 8 * maxn));
    CK(cudaMalloc(&y, 2L * 8 * maxn));
    CK(cudaMalloc(&ref, 2L * 8 * maxn));
    for (auto& b : io) {
        CK(cudaMalloc(&b, 2L * 8 * maxn));
        fill<<<64, 256>>>(b, 8L * maxn, 7u, 2.0f);
    }
    fill<<<64, 256>>>(x, 8L * maxn, 42u, 2.0f);
    CK(cudaDeviceSynchronize());
    printf("copy bandwidth %.2f TB/s; forward's projections %.1f MB\n", copy_tbs(st), L * layer_bytes / 1e6);

    const int stages[3] = {4, 6, 8};
    bool ok = true;
    for (int p = 0; p < 4; ++p) {
        const Proj& pr = P[p];
        const double mb = L * 2.0 * pr.n * pr.k;
        CK(launch_kernel(W[p][0], x, ref, pr.n, pr.k, false, st));
        for (int pdl = 0; pdl < 2; ++pdl) {
            float us = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) CK(launch_kernel(W[p][l], x, y, pr.n, pr.k, pdl, st));
            });
            printf("%-8s kernel          pdl%d %7.2f us/launch %.2f TB/s\n", pr.name, pdl, us / L, mb / (us * 1e-6) / 1e12);
        }
        for (int s : stages)
            for (int per_sm : {1, 2}) {
                if (per_sm * (s * STAGE + 2 * 4 * 4 * 32 * 4) > 227 * 1024) continue;  // does not fit an SM twice
                CK(launch_bulk(s, per_sm, W[p][0], x, y, pr.n, pr.k, false, st));
                CK(cudaStreamSynchronize(st));
                const double err = max_rel(y, ref, (long)T * pr.n);
                if (!(err < 2e-2)) ok = false;
                for (int pdl = 0; pdl < 2; ++pdl) {
                    float us = capture_and_time(st, [&] {
                        for (int l = 0; l < L; ++l) CK(launch_bulk(s, per_sm, W[p][l], x, y, pr.n, pr.k, pdl, st));
                    });
                    printf("%-8s bulk S%d x%d/SM pdl%d %7.2f us/launch %.2f TB/s err %.2e%s\n", pr.name, s, per_sm, pdl,
                           us / L, mb / (us * 1e-6) / 1e12, err, err < 2e-2 ? "" : " FAIL");
                }
            }
    }
    // the forward's chain under PDL: each projection reads the one before's output
    for (int spin = 0; spin < 2; ++spin) {
        auto chain = [&](auto launch) {
            return capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l)
                    for (int p = 0; p < 4; ++p) {
                        CK(launch(W[p][l], io[p], io[(p + 1) % 4], P[p].n, P[p].k));
                        if (p == 0 && spin) launch_spin(st, 11000);
                    }
            });
        };
        float us = chain([&](const bf* w, const bf* a, bf* b, int n, int k) { return launch_kernel(w, a, b, n, k, true, st); });
        printf("chain%s kernel pdl1: %.1f us per forward = %.2f TB/s\n", spin ? "+11us" : "", us,
               L * layer_bytes / (us * 1e-6) / 1e12);
        for (int s : stages)
            for (int per_sm : {1, 2}) {
                if (per_sm * (s * STAGE + 2 * 4 * 4 * 32 * 4) > 227 * 1024) continue;
                us = chain([&](const bf* w, const bf* a, bf* b, int n, int k) { return launch_bulk(s, per_sm, w, a, b, n, k, true, st); });
                printf("chain%s bulk S%d x%d/SM pdl1: %.1f us per forward = %.2f TB/s\n", spin ? "+11us" : "", s, per_sm, us,
                       L * layer_bytes / (us * 1e-6) / 1e12);
            }
    }
    CK(cudaDeviceSynchronize());
    printf(ok ? "done: every bulk result within 2e-2 of the kernel\n" : "FAIL: a bulk result differs from the kernel\n");
    return ok ? 0 : 1;
}
