// Does the gemv stream faster from W re-laid out in the order its warps read it (kernels/gemv.cu's
// PACKED form: a warp's load is 512 contiguous bytes and a tile one contiguous run) than from the
// checkpoint's [out, in] rows (a warp's load: 8 rows' 64-byte runs, K x 2 bytes apart)?
//
//   nvcc -O3 -arch=sm_90 -o /tmp/packed_bench scripts/packed_bench.cu && /tmp/packed_bench
//   GEMV_SHAPE=4b /tmp/packed_bench    # or 8b (default 1.7b)
//
// Why: on the H200 the projections stream at 2.5-3.1 TB/s against a copy bandwidth of 4.2
// (docs/perf.md); the rows a warp reads at once are 8 DRAM pages apart. Packing would be done
// once at load, on the device, for the streamed layer's weights.
//
// Prints, for T = 4, in one run: the copy bandwidth; per projection, in the form the streamed
// layer runs it (q|k|v with the norm, o and down adding the residual, gate|up paired with the
// norm) at the model's split, both layouts, L launches in a CUDA graph, without and with PDL;
// the forward's chain (L x the four, PDL) alone and with an 11 us stand-in for attention after
// q|k|v, both layouts; then, packed, each projection's split swept inside that chain (as
// gemv_bench.cu does for the rows layout). And each weight's plain product by the bulk-copy
// engine on the packed layout (bulk_packed: one 8 KiB copy a stage) beside the register kernel
// on both layouts. Checks every packed result of the register kernel equals the rows one bit
// for bit (same fragments, same sums), the bulk one within 2e-2 (another order of sums); exit 1
// if not.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../kernels/gemv.cu"

#include "bench_common.cuh"

// The bulk-copy engine on the packed layout: on rows, a bulk-copy gemv copied 512-byte row
// pieces, 16 a stage, and streamed at half the register kernel's speed. Packed, a stage of
// one tile (8 steps of 32 k, 8 KiB) is one contiguous run, so one `cp.async.bulk` a stage; and
// the stage sits in shared memory in fragment order, so a warp reads 512 contiguous bytes (no
// bank conflicts). Plain product only; 128 threads, warp w takes steps 2w and 2w + 1 of a stage;
// one block an SM, each a contiguous run of tiles; S stages asked for before the PDL wait.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

template <int S>
__global__ void __launch_bounds__(128) bulk_packed(const uint4* __restrict__ pw, const uint4* __restrict__ x,
                                                   unsigned short* __restrict__ y, int t_len, int n, int k8) {
    constexpr int STAGE = 8 * 64;  // uint4s: 8 steps x 2 rows x 32 lanes
    extern __shared__ __align__(128) uint4 sm[];
    __shared__ __align__(8) unsigned long long bars[S];
    __shared__ float red[2][4][4][32];
    launch_dependents();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int steps = k8 / 4, chunks = steps / 8, tiles = n / 16;
    const int t0 = (int)((long)tiles * blockIdx.x / gridDim.x), t1 = (int)((long)tiles * (blockIdx.x + 1) / gridDim.x);
    const int items = (t1 - t0) * chunks;
    const unsigned base = (unsigned)__cvta_generic_to_shared(sm), bar0 = (unsigned)__cvta_generic_to_shared(bars);
    // item i: tile t0 + i / chunks, steps [8 (i % chunks), +8): contiguous in pw
    auto issue = [&](int i, int s) {
        mbar_expect(bar0 + 8 * s, STAGE * 16);
        bulk_copy(base + s * STAGE * 16, pw + ((long)(t0 + i / chunks) * steps + 8 * (i % chunks)) * 64, STAGE * 16,
                  bar0 + 8 * s);
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) mbar_init(bar0 + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int i = 0; i < S && i < items; ++i) issue(i, i);
    }
    __syncthreads();
    dependency_wait();
    const bool live = g < t_len;
    const uint4* xg = x + (long)(live ? g : 0) * k8 + q;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < items; ++i) {
        const int s = i % S, tl = i / chunks, ch = i % chunks;
        mbar_wait(bar0 + 8 * s, (i / S) & 1);
        const uint4* st = sm + s * STAGE;
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
            const int j = 2 * warp + jj;
            const uint4 a = st[j * 64 + lane], b = st[j * 64 + 32 + lane];
            const uint4 xv = live ? xg[(ch * 8 + j) * 4] : zero;
            mma(c, a, b, xv.x, xv.y, false);
            mma(c, a, b, xv.z, xv.w, true);
        }
        const bool last = ch == chunks - 1;
        if (last)
#pragma unroll
            for (int e = 0; e < 4; ++e) red[tl & 1][warp][e][lane] = c[e];
        __syncthreads();
        if (threadIdx.x == 0 && i + S < items) issue(i + S, s);
        if (!last) continue;
#pragma unroll
        for (int e = 0; e < 4; ++e) c[e] = 0.f;
        if (warp != 0) continue;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float v = red[tl & 1][0][e][lane] + red[tl & 1][1][e][lane] + red[tl & 1][2][e][lane] + red[tl & 1][3][e][lane];
            const int row = (t0 + tl) * 16 + g + (e >> 1) * 8, t = 2 * q + (e & 1);
            if (t < t_len) y[(long)t * n + row] = to_bf16(v);
        }
    }
}

enum Form { NORM, ADD, PAIR_NORM };
struct Proj {
    const char* name;
    int n, k;  // output rows (gate|up: of a half), inputs
    Form form;
};
struct Cfg {
    int u, ks, tb;
};
static int w_rows(const Proj& p) { return p.form == PAIR_NORM ? 2 * p.n : p.n; }

static GemvFn form_fn(Form f, int u, bool packed) {
    if (packed) {
        if (f == NORM) return u == 8 ? gk<8, false, true, false, true> : gk<4, false, true, false, true>;
        if (f == ADD) return u == 8 ? gk<8, false, false, true, true> : gk<4, false, false, true, true>;
        return u == 8 ? gk<8, true, true, false, true> : gk<4, true, true, false, true>;
    }
    if (f == NORM) return u == 8 ? gk<8, false, true, false, false> : gk<4, false, true, false, false>;
    if (f == ADD) return u == 8 ? gk<8, false, false, true, false> : gk<4, false, false, true, false>;
    return u == 8 ? gk<8, true, true, false, false> : gk<4, true, true, false, false>;
}

static cudaError_t launch(const Proj& p, Cfg c, bool packed, const bf* w, const bf* x, bf* y, const bf* res, bool pdl,
                          cudaStream_t st) {
    return launch_form(form_fn(p.form, c.u, packed), c.ks, c.tb, p.form == PAIR_NORM, w, x, y, p.form != ADD,
                       p.form == ADD ? res : nullptr, p.n, p.k, pdl, st);
}

static Cfg model_cfg(const Proj& p, bool packed) {
    const Split s = gemv_split(p.n, p.k, p.form == PAIR_NORM, packed);
    return {s.u, s.ks, s.tb};
}

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
    const int L = S.layers;
    const Proj P[4] = {{"qkv", S.q + 2 * S.kv, S.hidden, NORM}, {"o", S.hidden, S.q, ADD},
                       {"gate_up", S.inter, S.hidden, PAIR_NORM}, {"down", S.hidden, S.inter, ADD}};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("shape SDAR-%s, device %s, %d SMs, T = %d\n", S.name, prop.name, prop.multiProcessorCount, T);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (Form f : {NORM, ADD, PAIR_NORM})
        for (int u : {4, 8})
            for (bool pk : {false, true}) {
                CK(cudaFuncSetAttribute(form_fn(f, u, pk), cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
                CK(cudaFuncSetAttribute(form_fn(f, u, pk), cudaFuncAttributePreferredSharedMemoryCarveout, 58));
            }
    CK(cudaFuncSetAttribute(spin_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 58));
    for (auto f : {bulk_packed<4>, bulk_packed<8>, bulk_packed<12>})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 12 * 8 * 64 * 16));
    for (auto f : {gk<4, false, false, false, false>, gk<8, false, false, false, false>, gk<4, false, false, false, true>,
                   gk<8, false, false, false, true>})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
    std::vector<bf*> W[4], PW[4];
    double layer_bytes = 0;
    long maxn = 0;
    for (int p = 0; p < 4; ++p) {
        const long elems = (long)w_rows(P[p]) * P[p].k;
        layer_bytes += 2.0 * elems;
        maxn = std::max(maxn, (long)std::max(w_rows(P[p]), P[p].k));
        for (int l = 0; l < L; ++l) {
            bf *w, *pw;
            CK(cudaMalloc(&w, 2 * elems));
            CK(cudaMalloc(&pw, 2 * elems));
            fill<<<1024, 256>>>(w, elems, 1234u + 97u * p + 7919u * l, 0.25f);
            // the production repack kernel (kernels/gemv.cu): the bit-equality checks below check it too
            unmask_repack<<<1024, 256>>>((const uint4*)w, (uint4*)pw, w_rows(P[p]), P[p].k / 8, 1);
            W[p].push_back(w);
            PW[p].push_back(pw);
        }
    }
    bf *x, *y, *ref, *res, *io[4];
    for (bf** b : {&x, &y, &ref, &res}) CK(cudaMalloc(b, 2L * 8 * maxn));
    for (auto& b : io) {
        CK(cudaMalloc(&b, 2L * 8 * maxn));
        fill<<<64, 256>>>(b, 8L * maxn, 7u, 2.0f);
    }
    fill<<<64, 256>>>(x, 8L * maxn, 42u, 2.0f);
    fill<<<64, 256>>>(res, 8L * maxn, 43u, 2.0f);
    CK(cudaDeviceSynchronize());
    printf("copy bandwidth %.2f TB/s; forward's projections %.1f MB\n", copy_tbs(st), L * layer_bytes / 1e6);

    bool ok = true;
    for (int p = 0; p < 4; ++p) {
        const Proj& pr = P[p];
        const Cfg c = model_cfg(pr, false);
        const double mb = L * 2.0 * w_rows(pr) * pr.k;
        CK(launch(pr, c, false, W[p][0], x, ref, res, false, st));
        CK(launch(pr, c, true, PW[p][0], x, y, res, false, st));
        CK(cudaStreamSynchronize(st));
        const double err = max_rel(y, ref, (long)T * pr.n);
        if (err != 0.0) ok = false;
        for (int pdl = 0; pdl < 2; ++pdl) {
            float ur = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) CK(launch(pr, c, false, W[p][l], x, y, res, pdl, st));
            });
            float up = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) CK(launch(pr, c, true, PW[p][l], x, y, res, pdl, st));
            });
            printf("%-8s u%d ks%d tb%d pdl%d rows %7.2f us %.2f TB/s | packed %7.2f us %.2f TB/s  %s\n", pr.name, c.u, c.ks,
                   c.tb, pdl, ur / L, mb / (ur * 1e-6) / 1e12, up / L, mb / (up * 1e-6) / 1e12,
                   err == 0.0 ? "equal" : "FAIL: differs");
        }
    }
    // the plain product (no norm, no residual) of every projection's weight: register kernel
    // on rows and packed, and the bulk-copy engine on packed (one copy a stage)
    for (int p = 0; p < 4; ++p) {
        const int n = w_rows(P[p]), k = P[p].k;
        const Split sp = gemv_split(n, k, false);
        const Cfg c = {sp.u, sp.ks, sp.tb};
        const double mb = L * 2.0 * n * k;
        auto reg = [&](bool packed, const bf* w, bool pdl) {
            GemvFn f = packed ? (c.u == 8 ? gk<8, false, false, false, true> : gk<4, false, false, false, true>)
                              : (c.u == 8 ? gk<8, false, false, false, false> : gk<4, false, false, false, false>);
            return launch_form(f, c.ks, c.tb, false, w, x, y, false, nullptr, n, k, pdl, st);
        };
        auto bulk = [&](int S, const bf* pw, bool pdl) {
            cudaLaunchAttribute at;
            const cudaLaunchConfig_t lc = launch_config(dim3(std::min(n / 16, prop.multiProcessorCount)), dim3(128),
                                                        (size_t)S * 8 * 64 * 16, pdl, st, &at);
            auto f = S == 4 ? bulk_packed<4> : S == 8 ? bulk_packed<8> : bulk_packed<12>;
            return cudaLaunchKernelEx(&lc, f, (const uint4*)pw, (const uint4*)x, (unsigned short*)y, T, n, k / 8);
        };
        CK(reg(false, W[p][0], false));
        CK(cudaMemcpyAsync(ref, y, 2L * T * n, cudaMemcpyDeviceToDevice, st));
        for (int S : {4, 8, 12}) {
            CK(bulk(S, PW[p][0], false));
            CK(cudaStreamSynchronize(st));
            const double err = max_rel(y, ref, (long)T * n);
            if (!(err < 2e-2)) ok = false;
            const float us = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) CK(bulk(S, PW[p][l], true));
            });
            printf("%-8s plain, bulk packed S%-2d pdl1 %7.2f us %.2f TB/s err %.1e%s\n", P[p].name, S, us / L,
                   mb / (us * 1e-6) / 1e12, err, err < 2e-2 ? "" : " FAIL");
        }
        for (int packed = 0; packed < 2; ++packed) {
            const float us = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) CK(reg(packed, (packed ? PW : W)[p][l], true));
            });
            printf("%-8s plain, register %s pdl1 %7.2f us %.2f TB/s\n", P[p].name, packed ? "packed" : "rows  ", us / L,
                   mb / (us * 1e-6) / 1e12);
        }
    }
    auto chain = [&](bool packed, const Cfg* c, bool spin) {
        return capture_and_time(st, [&] {
            for (int l = 0; l < L; ++l)
                for (int p = 0; p < 4; ++p) {
                    CK(launch(P[p], c[p], packed, (packed ? PW : W)[p][l], io[p], io[(p + 1) % 4], res, true, st));
                    if (p == 0 && spin) launch_spin(st, 11000);
                }
        });
    };
    // each layout at the model's splits for it (gemv_split: MEASURED_PACKED for packed weights)
    Cfg model[4], model_packed[4];
    for (int p = 0; p < 4; ++p) model[p] = model_cfg(P[p], false), model_packed[p] = model_cfg(P[p], true);
    for (int spin = 0; spin < 2; ++spin)
        for (int packed = 0; packed < 2; ++packed) {
            const float us = chain(packed, packed ? model_packed : model, spin);
            printf("chain%s %s pdl1: %.1f us per forward = %.2f TB/s\n", spin ? "+11us" : "", packed ? "packed" : "rows", us,
                   L * layer_bytes / (us * 1e-6) / 1e12);
        }
    // packed: each projection's split in the chain with the stand-in, the others at the best so far
    Cfg cur[4] = {model_packed[0], model_packed[1], model_packed[2], model_packed[3]};
    float base = chain(true, cur, true);
    printf("sweep packed: chain+11us at the model's splits %.1f us per forward\n", base);
    for (int p = 0; p < 4; ++p) {
        const int steps = P[p].k / 32;
        for (int u : {4, 8})
            for (int ks : {1, 2, 4, 8, 16})
                for (int tb : {1, 2, 4}) {
                    if (ks > steps || 32 * ks * tb > 512 || (P[p].form == PAIR_NORM && u == 8 && ks * tb > 8)) continue;
                    Cfg c[4] = {cur[0], cur[1], cur[2], cur[3]};
                    c[p] = {u, ks, tb};
                    const float us = chain(true, c, true);
                    CK(cudaGetLastError());
                    if (us < base) base = us, cur[p] = c[p];
                }
        printf("sweep packed best so far: %s u%d ks%d tb%d -> %.1f us per forward\n", P[p].name, cur[p].u, cur[p].ks,
               cur[p].tb, base);
    }
    printf("sweep packed final chain+11us: %.1f us (again %.1f); rows at the model's splits: %.1f\n", base, chain(true, cur, true),
           chain(false, model, true));
    printf(ok ? "done: every packed result equals the rows layout's\n" : "FAIL: a packed result differs\n");
    return ok ? 0 : 1;
}
