// Does kernels/gemv.cu's bulk-copy form (W streamed by the copy engine into shared-memory
// stages, `gemv_bulk`, what UNMASK_GEMV_BULK=1 runs) move a projection's weights faster than
// its register form (each warp's batch of loads)? Both as the streamed layer runs them.
//
//   nvcc -O3 -arch=sm_90 -o /tmp/bulk_bench scripts/bulk_bench.cu && /tmp/bulk_bench
//   GEMV_SHAPE=4b /tmp/bulk_bench    # or 8b (default 1.7b)
//
// Prints, for T = 4, in one run: the device's copy bandwidth; per projection (L launches of one
// form in a CUDA graph, without and with PDL) the register form at the model's split and the
// bulk form at the model's plan (one block an SM), each in the form the layer uses (q|k|v with
// the norm folded, o and down adding the residual, gate|up paired with the norm); the plain
// bulk form at 4, 8 and 12 stages; then the forward's chain (L x q|k|v, o, gate|up, down) under
// PDL, alone and with an 11 us stand-in for q/k prep + attention after q|k|v, both forms.
// Checks every bulk result against the register form's (the sums' order differs: relative
// difference under 2e-2 of bf16 outputs, as gemv_bench.cu allows against cuBLAS); exit 1 if not.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../kernels/gemv.cu"

#include "bench_common.cuh"

typedef void (*BulkFn)(const unsigned short*, const unsigned short*, unsigned short*, const unsigned short*, int, int,
                       int, float);
template <int S>
__global__ void __launch_bounds__(128) bulk_plain(const unsigned short* w, const unsigned short* x, unsigned short* y,
                                                  const unsigned short* res, int t_len, int n, int k, float eps) {
    gemv_bulk<S, false, false, false>(w, x, y, res, t_len, n, k, eps);
}

static int T = 4, SMS = 132;
static const size_t STAGE_ROW = 2 * BULK_K + 64;

// The layer's four forms: q|k|v (norm), o (add), gate|up (paired, norm; n = rows of a half), down (add).
enum Form { NORM, ADD, PAIR_NORM };
struct Proj {
    const char* name;
    int n, k;
    Form form;
};

static int w_rows(const Proj& p) { return p.form == PAIR_NORM ? 2 * p.n : p.n; }

// the register form at src/model/gemv.rs's split
static cudaError_t launch_reg(const Proj& p, const bf* w, const bf* x, bf* y, const bf* res, bool pdl, cudaStream_t st) {
    const bool pair = p.form == PAIR_NORM;
    const Split s = gemv_split(p.n, p.k, pair);
    const int tiles = (p.n + 15) / 16;
    const int sums = (pair ? 8 : 4) + (p.form != ADD ? 1 : 0);
    const size_t smem = std::max((size_t)T * (p.k / 8 + 1) * 16, s.ks > 1 ? (size_t)s.ks * s.tb * 32 * 4 * sums : 0);
    auto f = p.form == NORM ? unmask_gemv_norm_u8 : p.form == ADD ? unmask_gemv_add_u8 : unmask_gemv_norm_silu_u4;
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t lc = launch_config(dim3((tiles + s.tb - 1) / s.tb), dim3(32 * s.ks * s.tb), smem, pdl, st, &at);
    return cudaLaunchKernelEx(&lc, f, (const uint4*)w, (const uint4*)x, (unsigned short*)y,
                              (const unsigned short*)(p.form == ADD ? res : nullptr), T, p.n, p.k / 8, s.ks, 1e-6f);
}

// the bulk form at the plan src/model/gemv.rs's BulkLaunch::plan makes (or `plain` at S stages)
static cudaError_t launch_bulk(const Proj& p, const bf* w, const bf* x, bf* y, const bf* res, bool pdl, cudaStream_t st,
                               int plain_stages = 0) {
    if (p.n % 16 || p.k % BULK_K) {
        fprintf(stderr, "bulk: n %d k %d not multiples of 16, %d\n", p.n, p.k, BULK_K);
        exit(2);
    }
    BulkFn f;
    size_t smem;
    if (plain_stages) {
        f = plain_stages == 4 ? bulk_plain<4> : plain_stages == 8 ? bulk_plain<8> : bulk_plain<12>;
        smem = plain_stages * 16 * STAGE_ROW;
    } else {
        f = p.form == NORM ? unmask_gemv_bulk_norm : p.form == ADD ? unmask_gemv_bulk_add : unmask_gemv_bulk_norm_silu;
        smem = p.form == PAIR_NORM ? 4 * 32 * STAGE_ROW : 8 * 16 * STAGE_ROW;
    }
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t lc = launch_config(dim3(std::min(p.n / 16, SMS)), dim3(128), smem, pdl, st, &at);
    return cudaLaunchKernelEx(&lc, f, (const unsigned short*)w, (const unsigned short*)x, (unsigned short*)y,
                              (const unsigned short*)(p.form == ADD ? res : nullptr), T, p.n, p.k,
                              plain_stages ? 0.0f : 1e-6f);
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
    const Proj P[4] = {{"qkv", QKV, S.hidden, NORM}, {"o", S.hidden, S.q, ADD}, {"gate_up", S.inter, S.hidden, PAIR_NORM},
                       {"down", S.hidden, S.inter, ADD}};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    SMS = prop.multiProcessorCount;
    printf("shape SDAR-%s, device %s, %d SMs, T = %d\n", S.name, prop.name, SMS, T);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    // the model's split of shared memory for these kernels (src/model/cuda/launch.rs)
    for (const void* f : {(const void*)unmask_gemv_norm_u8, (const void*)unmask_gemv_add_u8, (const void*)unmask_gemv_norm_silu_u4,
                          (const void*)unmask_gemv_bulk_norm, (const void*)unmask_gemv_bulk_add, (const void*)unmask_gemv_bulk_norm_silu,
                          (const void*)bulk_plain<4>, (const void*)bulk_plain<8>, (const void*)bulk_plain<12>}) {
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
        CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, 58));
    }
    std::vector<bf*> W[4];
    double layer_bytes = 0;
    long maxn = 0;
    for (int p = 0; p < 4; ++p) {
        layer_bytes += 2.0 * w_rows(P[p]) * P[p].k;
        maxn = std::max(maxn, (long)std::max(w_rows(P[p]), P[p].k));
        for (int l = 0; l < L; ++l) {
            bf* w;
            CK(cudaMalloc(&w, 2L * w_rows(P[p]) * P[p].k));
            fill<<<1024, 256>>>(w, (long)w_rows(P[p]) * P[p].k, 1234u + 97u * p + 7919u * l, 0.25f);
            W[p].push_back(w);
        }
    }
    bf *x, *y, *ref, *res, *io[4];
    CK(cudaMalloc(&x, 2L * 8 * maxn));
    CK(cudaMalloc(&y, 2L * 8 * maxn));
    CK(cudaMalloc(&ref, 2L * 8 * maxn));
    CK(cudaMalloc(&res, 2L * 8 * maxn));
    for (auto& b : io) {
        CK(cudaMalloc(&b, 2L * 8 * maxn));
        fill<<<64, 256>>>(b, 8L * maxn, 7u, 2.0f);
    }
    fill<<<64, 256>>>(x, 8L * maxn, 42u, 2.0f);
    fill<<<64, 256>>>(res, 8L * maxn, 43u, 2.0f);
    CK(cudaDeviceSynchronize());
    printf("copy bandwidth %.2f TB/s; forward's projections %.1f MB\n", copy_tbs(st), L * layer_bytes / 1e6);

    bool ok = true;
    auto check = [&](const char* what, const Proj& p) {
        CK(cudaStreamSynchronize(st));
        const double err = max_rel(y, ref, (long)T * p.n);
        if (!(err < 2e-2)) ok = false;
        return err;
    };
    for (int p = 0; p < 4; ++p) {
        const Proj& pr = P[p];
        const double mb = L * 2.0 * w_rows(pr) * pr.k;
        CK(launch_reg(pr, W[p][0], x, ref, res, false, st));
        CK(launch_bulk(pr, W[p][0], x, y, res, false, st));
        const double err = check("bulk", pr);
        for (int pdl = 0; pdl < 2; ++pdl) {
            float ur = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) CK(launch_reg(pr, W[p][l], x, y, res, pdl, st));
            });
            float ub = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) CK(launch_bulk(pr, W[p][l], x, y, res, pdl, st));
            });
            printf("%-8s pdl%d register %7.2f us %.2f TB/s | bulk %7.2f us %.2f TB/s err %.2e%s\n", pr.name, pdl, ur / L,
                   mb / (ur * 1e-6) / 1e12, ub / L, mb / (ub * 1e-6) / 1e12, err, err < 2e-2 ? "" : " FAIL");
        }
        // the plain product at other stage counts (its own reference: the plain register form is
        // the ADD form without a residual, so compare against bulk_plain<8>)
        const Proj plain = {pr.name, w_rows(pr), pr.k, ADD};
        CK(launch_bulk(plain, W[p][0], x, ref, nullptr, false, st, 8));
        for (int s : {4, 8, 12}) {
            CK(launch_bulk(plain, W[p][0], x, y, nullptr, false, st, s));
            const double e = check("stages", plain);
            float us = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l) CK(launch_bulk(plain, W[p][l], x, y, nullptr, true, st, s));
            });
            printf("%-8s plain bulk S%-2d pdl1 %7.2f us %.2f TB/s err %.2e%s\n", pr.name, s, us / L, mb / (us * 1e-6) / 1e12,
                   e, e < 2e-2 ? "" : " FAIL");
        }
    }
    // the forward's chain under PDL: each projection reads the one before's output
    for (int spin = 0; spin < 2; ++spin) {
        for (int bulk = 0; bulk < 2; ++bulk) {
            float us = capture_and_time(st, [&] {
                for (int l = 0; l < L; ++l)
                    for (int p = 0; p < 4; ++p) {
                        const bf* in = io[p];
                        bf* out = io[(p + 1) % 4];
                        CK(bulk ? launch_bulk(P[p], W[p][l], in, out, res, true, st) : launch_reg(P[p], W[p][l], in, out, res, true, st));
                        if (p == 0 && spin) launch_spin(st, 11000);
                    }
            });
            printf("chain%s %s pdl1: %.1f us per forward = %.2f TB/s\n", spin ? "+11us" : "", bulk ? "bulk" : "register", us,
                   L * layer_bytes / (us * 1e-6) / 1e12);
        }
    }
    CK(cudaDeviceSynchronize());
    printf(ok ? "done: every bulk result within 2e-2 of the register form\n" : "FAIL: a bulk result differs from the register form\n");
    return ok ? 0 : 1;
}
