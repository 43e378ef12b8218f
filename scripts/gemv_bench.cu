// Microbenchmark of kernels/gemv.cu against cuBLAS on the H200, for the few-row projections of
// an SDAR-1.7B block pass, in CUDA graphs like the decode's own. Needs only nvcc and cuBLAS (the
// GPU host has both; no cargo there), so kernel designs are compared in one device call:
//
//   nvcc -O3 -arch=sm_90 -o /tmp/gemv_bench scripts/gemv_bench.cu -lcublas && /tmp/gemv_bench
//   GEMV_SHAPE=4b /tmp/gemv_bench    # or 8b: SDAR-4B's or SDAR-8B's projections (default 1.7b)
//
// Every projection of every layer has its own weights (28 layers x 100 MB, far past the 50 MB
// L2), so each graph replay streams them from HBM as a forward does. Prints, for T = 4 and 8:
// per-projection time (28 launches of one kind in a graph), the whole projection chain of a
// forward, and the chain with a small dependent kernel between projections (the decode's
// norms and attention), each with cuBLAS, with the kernel, and with the kernel under
// programmatic dependent launch; then the streamed layer's chain (its norm and residual
// forms), alone and with an 11 us stand-in for q/k prep + attention, under the driver's
// L1/shared split and the model's (58 % shared), and a sweep of each
// projection's split inside that chain. Checks every kernel result against cuBLAS.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <vector>

#include "../kernels/gemv.cu"

#include "bench_common.cuh"

#define CB(x)                                                                        \
    do {                                                                             \
        cublasStatus_t s = (x);                                                      \
        if (s != CUBLAS_STATUS_SUCCESS) {                                            \
            fprintf(stderr, "%s:%d %s: cublas %d\n", __FILE__, __LINE__, #x, (int)s); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

// Stand-in for the small kernels between projections: reads the projection's output, writes the
// next projection's input (a few KB), one block; lets dependents launch at once.
__global__ void small_kernel(const bf* in, bf* out, int n_in, int n_out, int pdl) {
    if (pdl) launch_dependents();
    dependency_wait();
    float s = 0.f;
    for (int i = threadIdx.x; i < n_in; i += blockDim.x) s += __uint_as_float(((unsigned)in[i]) << 16);
    for (int i = threadIdx.x; i < n_out; i += blockDim.x) out[i] = to_bf16(1e-3f * s + 0.01f * (i % 7));
}

struct Proj {
    const char* name;
    int n, k;   // output rows (for the paired form: gate rows), input features
    int wrows;  // rows of W (2 n for gate|up)
};

struct Cfg {
    int u, ks, tb;  // unroll, warps per tile, tiles per block
    bool pair;
};

static cublasHandle_t H;

// The plain and paired forms (no norm, no residual) with split c.
static cudaError_t launch_kernel(const Cfg& c, const bf* w, const bf* x, bf* y, int n, int k, bool pdl, cudaStream_t st) {
    GemvFn f = c.pair ? unmask_gemv_silu_u4 : (c.u == 8 ? unmask_gemv_u8 : unmask_gemv_u4);
    return launch_form(f, c.ks, c.tb, c.pair, w, x, y, false, nullptr, n, k, pdl, st);
}

static void launch_cublas(const bf* w, const bf* x, bf* y, int n, int k) {
    float one = 1.f, zero = 0.f;
    // y^T [n, T] (column-major, ld n) = W [n, k] (row-major = col-major k x n, transposed) . x^T
    CB(cublasGemmEx(H, CUBLAS_OP_T, CUBLAS_OP_N, n, T, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &zero, y,
                    CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

__global__ void silu_mul_ref(const bf* gu, bf* out, int t_len, int inter) {
    long n = (long)t_len * inter;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long t = i / inter, j = i % inter;
        float g = __uint_as_float(((unsigned)gu[t * 2 * inter + j]) << 16);
        float u = __uint_as_float(((unsigned)gu[t * 2 * inter + inter + j]) << 16);
        out[i] = to_bf16(g / (1.0f + expf(-g)) * u);
    }
}

// The model's split (bench_common.cuh, gemv_split), against which the sweep below compares.
static Cfg model_split(int n, int k, bool pair) {
    const Split s = gemv_split(n, k, pair);
    return {s.u, s.ks, s.tb, pair};
}

int main() {
    const Shape S = bench_shape();
    const int L = S.layers, QKV = S.q + 2 * S.kv, HID = S.hidden, INTER = S.inter;
    const long MAXN = 2L * INTER;  // the widest row of x or y (gate|up's output)
    printf("shape SDAR-%s: %d layers, hidden %d, q|k|v %d, intermediate %d\n", S.name, L, HID, QKV, INTER);
    Proj P[4] = {{"qkv", QKV, HID, QKV}, {"o", HID, S.q, HID}, {"gate_up", 2 * INTER, HID, 2 * INTER}, {"down", HID, INTER, HID}};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CB(cublasCreate(&H));
    for (auto f : {unmask_gemv_u4, unmask_gemv_u8, unmask_gemv_silu_u4, unmask_gemv_add_u8, unmask_gemv_norm_u8,
                   unmask_gemv_norm_silu_u4})
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
    CB(cublasSetStream(H, st));
    void* ws;
    CK(cudaMalloc(&ws, 32 << 20));
    CB(cublasSetWorkspace(H, ws, 32 << 20));
    std::vector<bf*> W[4];
    double bytes_layer = 0;
    for (int p = 0; p < 4; ++p) {
        bytes_layer += 2.0 * P[p].wrows * P[p].k;
        for (int l = 0; l < L; ++l) {
            bf* w;
            CK(cudaMalloc(&w, 2L * P[p].wrows * P[p].k));
            fill<<<1024, 256>>>(w, (long)P[p].wrows * P[p].k, 1234u + 97u * p + 7919u * l, 0.25f);
            W[p].push_back(w);
        }
    }
    CK(cudaDeviceSynchronize());
    bf *x, *y, *y2, *h;
    CK(cudaMalloc(&x, 2L * 8 * MAXN));
    CK(cudaMalloc(&y, 2L * 8 * MAXN));
    CK(cudaMalloc(&y2, 2L * 8 * MAXN));
    CK(cudaMalloc(&h, 2L * 8 * MAXN));
    fill<<<64, 256>>>(x, 8L * MAXN, 42u, 2.0f);
    CK(cudaDeviceSynchronize());
    printf("layer weights %.1f MB, forward (28 layers) %.1f MB\n", bytes_layer / 1e6, L * bytes_layer / 1e6);

    // candidate splits per projection (the best of a wider sweep of this bench)
    std::vector<Cfg> cands[4] = {
        {{8, 8, 1}, {4, 16, 1}, {8, 4, 2}},
        {{8, 8, 1}, {4, 16, 1}, {8, 16, 1}},
        {{8, 4, 2}, {8, 2, 4}, {4, 2, 4}, {8, 8, 1}},
        {{8, 16, 1}, {4, 16, 1}, {8, 12, 1}},
    };
    std::vector<Cfg> pair_cands = {{4, 8, 1, true}, {4, 4, 2, true}};

    for (int tt : {4}) {
        T = tt;
        printf("\n=== T = %d\n", T);
        Cfg best[4];
        float best_us[4];
        for (int p = 0; p < 4; ++p) {
            const Proj& pr = P[p];
            double mb = L * 2.0 * pr.wrows * pr.k;
            float cub = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) launch_cublas(W[p][l], x, y, pr.n, pr.k);
            });
            printf("%-8s cublas           %7.2f us/launch  %.2f TB/s\n", pr.name, cub / L, mb / (cub * 1e-6) / 1e12);
            launch_cublas(W[p][0], x, y2, pr.n, pr.k);
            best_us[p] = 1e9;
            for (const Cfg& c : cands[p]) {
                if (launch_kernel(c, W[p][0], x, y, pr.n, pr.k, false, st) != cudaSuccess) {
                    printf("%-8s u%d ks%-2d tb%d: does not launch (%s)\n", pr.name, c.u, c.ks, c.tb, cudaGetErrorString(cudaGetLastError()));
                    continue;
                }
                CK(cudaStreamSynchronize(st));
                double err = max_rel(y, y2, (long)T * pr.n);
                for (int pdl = 0; pdl < 2; ++pdl) {
                    float us = capture_and_time(st, [&] {
                        for (int l = 0; l < L; ++l) launch_kernel(c, W[p][l], x, y, pr.n, pr.k, pdl, st);
                    });
                    printf("%-8s u%d ks%-2d tb%d pdl%d  %7.2f us/launch  %.2f TB/s  err %.2e\n", pr.name, c.u,
                           c.ks, c.tb, pdl, us / L, mb / (us * 1e-6) / 1e12, err);
                    if (!pdl && us < best_us[p]) best_us[p] = us, best[p] = c;
                }
            }
        }
        // gate|up with silu fused against cuBLAS + the silu kernel
        {
            const Proj& pr = P[2];
            int inter = pr.n / 2;
            double mb = L * 2.0 * pr.wrows * pr.k;
            float cub = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) {
                    launch_cublas(W[2][l], x, y, pr.n, pr.k);
                    silu_mul_ref<<<(T * inter + 255) / 256, 256, 0, st>>>(y, h, T, inter);
                }
            });
            printf("gate_up+silu cublas+silu   %7.2f us/launch  %.2f TB/s\n", cub / L, mb / (cub * 1e-6) / 1e12);
            launch_cublas(W[2][0], x, y, pr.n, pr.k);
            silu_mul_ref<<<(T * inter + 255) / 256, 256, 0, st>>>(y, y2, T, inter);
            for (const Cfg& c : pair_cands) {
                if (launch_kernel(c, W[2][0], x, h, inter, pr.k, false, st) != cudaSuccess) {
                    printf("gate_up+silu u%d ks%-2d tb%d: does not launch (%s)\n", c.u, c.ks, c.tb, cudaGetErrorString(cudaGetLastError()));
                    continue;
                }
                CK(cudaStreamSynchronize(st));
                double err = max_rel(h, y2, (long)T * inter);
                for (int pdl = 0; pdl < 2; ++pdl) {
                    float us = capture_and_time(st, [&] {
                        for (int l = 0; l < L; ++l) launch_kernel(c, W[2][l], x, h, inter, pr.k, pdl, st);
                    });
                    printf("gate_up+silu u%d ks%-2d tb%d pdl%d  %7.2f us/launch  %.2f TB/s  err %.2e\n", c.u, c.ks,
                           c.tb, pdl, us / L, mb / (us * 1e-6) / 1e12, err);
                }
            }
        }
        // the chain of a forward: per layer qkv, o, gate|up, down; with and without a small kernel
        // between projections
        for (int between = 0; between < 2; ++between) {
            auto small = [&](int n_in, int n_out, bool pdl) {
                if (!between) return;
                small_kernel<<<1, 256, 0, st>>>(y, x, T * n_in, T * n_out, pdl);
            };
            float cub = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l)
                    for (int p = 0; p < 4; ++p) {
                        launch_cublas(W[p][l], x, y, P[p].n, P[p].k);
                        small(P[p].n, P[(p + 1) % 4].k, false);
                    }
            });
            printf("chain%s cublas: %.1f us per forward = %.2f TB/s\n", between ? "+small" : "", cub,
                   L * bytes_layer / (cub * 1e-6) / 1e12);
            for (int v = 0; v < 4; ++v) {
                const int pdl = v & 1, fuse_silu = v >> 1;
                float us = capture_and_time(st, [&] {
                    for (int l = 0; l < L; ++l)
                        for (int p = 0; p < 4; ++p) {
                            if (p == 2 && fuse_silu)
                                launch_kernel({4, 4, 2, true}, W[p][l], x, y, P[p].n / 2, P[p].k, pdl, st);
                            else
                                launch_kernel(best[p], W[p][l], x, y, P[p].n, P[p].k, pdl, st);
                            small(P[p].n, P[(p + 1) % 4].k, pdl);
                        }
                });
                printf("chain%s kernel (best splits) pdl%d silu-fused%d: %.1f us per forward = %.2f TB/s\n",
                       between ? "+small" : "", pdl, fuse_silu, us, L * bytes_layer / (us * 1e-6) / 1e12);
            }
        }
        // the streamed layer's chain (src/model/qwen3.rs, forward_streamed, less its two small
        // kernels): qkv with the input norm folded in, o + residual, gate|up with the post norm
        // and silu, down + residual; against the same launches of the plain forms
        {
            bf *mid, *act, *qkvb;
            CK(cudaMalloc(&mid, 2L * 8 * HID));
            CK(cudaMalloc(&act, 2L * 8 * INTER));
            CK(cudaMalloc(&qkvb, 2L * 8 * std::max(QKV, S.q)));
            fill<<<8, 256>>>(mid, 8L * HID, 8u, 2.0f);
            fill<<<8, 256>>>(act, 8L * INTER, 9u, 2.0f);
            // the model's splits of the four forms (q|k|v, o, gate|up paired, down)
            const Cfg ms[4] = {model_split(QKV, HID, false), model_split(HID, S.q, false), model_split(INTER, HID, true),
                               model_split(HID, INTER, false)};
            CK(cudaDeviceSynchronize());
            // bit 0: the norm forms for qkv and gate|up; bit 1: the residual forms for o and down
            for (int forms = 0; forms < 4; ++forms)
                for (int pdl = 0; pdl < 2; ++pdl) {
                    const bool norm = forms & 1, add = forms & 2;
                    float us = capture_and_time(st, [&] {
                        for (int l = 0; l < L; ++l) {
                            launch_form(norm ? unmask_gemv_norm_u8 : unmask_gemv_u8, ms[0].ks, ms[0].tb, false, W[0][l], x, qkvb,
                                        norm, nullptr, QKV, HID, pdl, st);
                            launch_form(add ? unmask_gemv_add_u8 : unmask_gemv_u8, ms[1].ks, ms[1].tb, false, W[1][l], qkvb, mid,
                                        false, add ? x : nullptr, HID, S.q, pdl, st);
                            launch_form(norm ? unmask_gemv_norm_silu_u4 : unmask_gemv_silu_u4, ms[2].ks, ms[2].tb, true, W[2][l],
                                        mid, act, norm, nullptr, INTER, HID, pdl, st);
                            launch_form(add ? unmask_gemv_add_u8 : unmask_gemv_u8, ms[3].ks, ms[3].tb, false, W[3][l], act, x,
                                        false, add ? mid : nullptr, HID, INTER, pdl, st);
                        }
                    });
                    printf("chain streamed-layer forms norm%d add%d pdl%d: %.1f us per forward = %.2f TB/s\n", norm, add,
                           pdl, us, L * bytes_layer / (us * 1e-6) / 1e12);
                }
            CK(cudaGetLastError());
            // the streamed layer with ~11 us of latency-bound kernels between q|k|v and o (as q/k
            // prep + attention take), under PDL; with the driver's L1/shared split (carveout -1)
            // and with the 58 % the model asks for (src/model/cuda/launch.rs, carveout)
            for (int cv : {-1, 58})
            for (int spin = 0; spin < 2; ++spin) {
                for (auto f : {unmask_gemv_norm_u8, unmask_gemv_add_u8, unmask_gemv_norm_silu_u4})
                    CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cv));
                CK(cudaFuncSetAttribute(spin_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cv));
                float us = capture_and_time(st, [&] {
                    for (int l = 0; l < L; ++l) {
                        launch_form(unmask_gemv_norm_u8, ms[0].ks, ms[0].tb, false, W[0][l], x, qkvb, true, nullptr, QKV, HID, true, st);
                        if (spin) launch_spin(st, 11000);
                        launch_form(unmask_gemv_add_u8, ms[1].ks, ms[1].tb, false, W[1][l], qkvb, mid, false, x, HID, S.q, true, st);
                        launch_form(unmask_gemv_norm_silu_u4, ms[2].ks, ms[2].tb, true, W[2][l], mid, act, true, nullptr, INTER, HID, true, st);
                        launch_form(unmask_gemv_add_u8, ms[3].ks, ms[3].tb, false, W[3][l], act, x, false, mid, HID, INTER, true, st);
                    }
                });
                printf("chain streamed%s pdl1%s: %.1f us per forward = %.2f TB/s\n", spin ? "+11us" : "",
                       cv < 0 ? "" : " carveout58", us, L * bytes_layer / (us * 1e-6) / 1e12);
            }
            for (auto f : {unmask_gemv_norm_u8, unmask_gemv_add_u8, unmask_gemv_norm_silu_u4})
                CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, -1));
            CK(cudaFuncSetAttribute(spin_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, -1));
            CK(cudaGetLastError());
        }
        // The splits in the chain the model runs (under PDL, an 11 us stand-in for q/k prep +
        // attention after q|k|v), one projection at a time, the others at the current best:
        // where a split wins inside the chain, which the standalone sweep above cannot show.
        {
            bf *mid, *act, *qkvb;
            CK(cudaMalloc(&mid, 2L * 8 * HID));
            CK(cudaMalloc(&act, 2L * 8 * INTER));
            CK(cudaMalloc(&qkvb, 2L * 8 * std::max(QKV, S.q)));
            // the forms: qkv norm, o add, gate|up norm + silu, down add; fn[p][u == 8]
            GemvFn fn[4][2] = {{gk<4, false, true, false>, gk<8, false, true, false>},
                               {gk<4, false, false, true>, gk<8, false, false, true>},
                               {gk<4, true, true, false>, gk<8, true, true, false>},
                               {gk<4, false, false, true>, gk<8, false, false, true>}};
            // under the model's L1/shared split (SWEEP_CARVEOUT=-1: the driver's), since the
            // best split of a projection may depend on it
            const char* cvs = getenv("SWEEP_CARVEOUT");
            const int cv = cvs ? atoi(cvs) : 58;
            for (auto& f2 : fn)
                for (auto f : f2) {
                    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
                    CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cv));
                }
            CK(cudaFuncSetAttribute(spin_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cv));
            printf("\nsweep under carveout %d\n", cv);
            const int out_n[4] = {QKV, HID, INTER, HID}, in_k[4] = {HID, S.q, HID, INTER};
            Cfg cur[4];
            for (int p = 0; p < 4; ++p) cur[p] = model_split(out_n[p], in_k[p], p == 2);
            auto chain = [&](const Cfg* c) {
                return capture_and_time(st, [&] {
                    for (int l = 0; l < L; ++l) {
                        bf* outs[4] = {qkvb, mid, act, x};
                        const bf* ins[4] = {x, qkvb, mid, act};
                        const bf* res[4] = {nullptr, x, nullptr, mid};
                        for (int p = 0; p < 4; ++p) {
                            launch_form(fn[p][c[p].u == 8], c[p].ks, c[p].tb, p == 2, W[p][l], ins[p], outs[p],
                                        p == 0 || p == 2, res[p], out_n[p], in_k[p], true, st);
                            if (p == 0) launch_spin(st, 11000);
                        }
                    }
                });
            };
            float base = chain(cur);
            printf("\nsweep: chain+11us with the model's splits: %.1f us per forward\n", base);
            for (int pass = 0; pass < 1; ++pass)
                for (int p = 0; p < 4; ++p) {
                    const int steps = in_k[p] / 32;
                    for (int u : {4, 8})
                        for (int ks : {1, 2, 4, 8, 10, 12, 16})
                            for (int tb : {1, 2, 4}) {
                                if (ks > steps || 32 * ks * tb > 512 || (p == 2 && u == 8 && ks * tb > 8)) continue;  // what fits an SM
                                Cfg c[4] = {cur[0], cur[1], cur[2], cur[3]};
                                c[p] = {u, ks, tb, p == 2};
                                float us = chain(c);
                                CK(cudaGetLastError());
                                if (us < base) {
                                    base = us;
                                    cur[p] = c[p];
                                }
                                if (pass == 0) printf("sweep %s u%d ks%d tb%d: %.1f us\n", P[p].name, u, ks, tb, us);
                            }
                    printf("sweep best so far: %s u%d ks%d tb%d -> %.1f us per forward\n", P[p].name, cur[p].u,
                           cur[p].ks, cur[p].tb, base);
                }
            for (int p = 0; p < 4; ++p)
                printf("sweep final %s: u%d ks%d tb%d\n", P[p].name, cur[p].u, cur[p].ks, cur[p].tb);
            printf("sweep final chain+11us: %.1f us per forward (again: %.1f)\n", base, chain(cur));
        }
        for (int p = 0; p < 4; ++p)
            printf("best %s: u%d ks%d tb%d %.2f us\n", P[p].name, best[p].u, best[p].ks, best[p].tb, best_us[p] / L);
    }
    CK(cudaDeviceSynchronize());
    printf("done\n");
    return 0;
}
