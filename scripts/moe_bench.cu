// Microbenchmark of an SDAR-30B-A3B sparse layer's MoE kernels on the H200 (the grouped forms of
// kernels/gemv.cu with kernels/moe.cuh), in CUDA graphs over 48 layers of their own weights, so
// every replay streams the experts from HBM as a forward does. Needs only nvcc (the GPU host has
// it; no cargo there):
//
//   nvcc -O3 -arch=sm_90 -o /tmp/moe_bench scripts/moe_bench.cu && /tmp/moe_bench [distinct]
//   compute-sanitizer --tool racecheck /tmp/moe_bench check   # PDL chain = serial chain, bit for bit
//
// The router logits are made so that the 4 rows of a block pass choose their 8 experts among
// `distinct` (default 9: what bench --random-init sdar-30b-a3b counts), so the grouped products
// read a known number of experts. Prints per-layer microseconds of the grouped gate|up and down
// kernels for each split (batch x warps on K x tiles a block), alone, with the bytes each reads
// over its time, and the sparse layer's four kernels (route, gate|up, down, combine) in a chain
// under programmatic dependent launch: with the experts in rows, then again with each expert
// packed in place (as the model loads them).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../kernels/gemv.cu"

#include "bench_common.cuh"

const int L = 48, E = 128, KC = 8, H = 2048, I = 768;  // T: bench_common.cuh (4 rows)

// Host-side bf16 of a float that is exactly representable or near enough (round to nearest even).
static bf host_bf16(float v) {
    unsigned u;
    memcpy(&u, &v, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf)(u >> 16);
}

template <int U, bool PACKED>
__global__ void up_k(const uint4* w, const uint4* x, unsigned short* y, const MoeTable* tab, int t_len, int n, int k8,
                     int ks, float eps) {
    moe_up<U, PACKED>(w, x, y, tab, t_len, n, k8, ks, eps);
}
template <int U, bool PACKED>
__global__ void down_k(const uint4* w, const uint4* x, float* part, const MoeTable* tab, int t_len, int n, int k8,
                       int ks) {
    moe_down<U, PACKED>(w, x, part, tab, t_len, n, k8, ks);
}

// The dense forms the sparse layer also runs (router, q|k|v with the norm folded in; o with the
// residual add), one launch a layer, each layer its own weights.
template <int U, bool NORM, bool ADD, bool PACKED>
__global__ void dense_k(const uint4* w, const uint4* x, unsigned short* y, const unsigned short* res, int t_len, int n,
                        int k8, int ks, float eps) {
    gemv<U, false, NORM, ADD, GRP_NONE, PACKED>(w, x, y, res, t_len, n, k8, ks, eps);
}

// What src/model/gemv.rs's Split::smem_bytes gives.
static int smem(int k, int ks, int tb, int sums, bool norm) {
    const int staged = T * (k / 8 + 1) * 16;
    const int part = ks > 1 ? ks * tb * 32 * 4 * (sums + (norm ? 1 : 0)) : 0;
    return std::max(staged, part);
}

static void launch(const void* f, dim3 grid, dim3 block, int sm, bool pdl, cudaStream_t st, void** args) {
    cudaLaunchAttribute a;
    const cudaLaunchConfig_t c = launch_config(grid, block, sm, pdl, st, &a);
    CK(cudaLaunchKernelExC(&c, f, args));
}

struct Bufs {
    std::vector<bf*> gate_up, down;
    std::vector<bf*> logits;
    MoeTable* tabs;
    unsigned long long* stats;
    bf *x, *act, *out;
    float* part;
};

// A grouped kernel over `n` output rows: its dynamic shared memory allowed, grid (column
// blocks, T * k slots), as src/model/cuda/moe.rs launches them.
static void grouped(const void* f, int n, Split s, int sm, bool pdl, cudaStream_t st, void** args) {
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
    launch(f, dim3((n + 16 * s.tb - 1) / (16 * s.tb), T * KC), dim3(32 * s.ks * s.tb), sm, pdl, st, args);
}

// The route kernel (one block of 32 T threads) writing layer l's table.
static void route(Bufs& b, int l, bool pdl, cudaStream_t st) {
    int t = T, e = E, k = KC, norm = 1;
    MoeTable* tab = b.tabs + l;
    void* args[] = {&b.logits[l], &tab, &b.stats, &t, &e, &k, &norm};
    launch((const void*)unmask_moe_route, dim3(1), dim3(32 * T), ROUTE_SCRATCH_WORDS(E) * 4, pdl, st, args);
}

template <int U, bool PACKED = false>
static void up(Bufs& b, int l, Split s, bool pdl, cudaStream_t st) {
    int t = T, n = I, k8 = H / 8, ks = s.ks;
    float eps = 1e-6f;
    MoeTable* tab = b.tabs + l;
    void* args[] = {&b.gate_up[l], &b.x, &b.act, &tab, &t, &n, &k8, &ks, &eps};
    grouped((const void*)up_k<U, PACKED>, I, s, smem(H, s.ks, s.tb, 8, true), pdl, st, args);
}

template <int U, bool PACKED = false>
static void down(Bufs& b, int l, Split s, bool pdl, cudaStream_t st) {
    int t = T, n = H, k8 = I / 8, ks = s.ks;
    MoeTable* tab = b.tabs + l;
    void* args[] = {&b.down[l], &b.act, &b.part, &tab, &t, &n, &k8, &ks};
    grouped((const void*)down_k<U, PACKED>, H, s, smem(I, s.ks, s.tb, 4, false), pdl, st, args);
}

// The sparse layer after its router as the model runs it (src/model/cuda/moe.rs): route, gate|up
// and down from its table (down reading it before its wait), combine; PDL off: one after another.
template <bool P>
static void four_kernels(Bufs& b, int l, cudaStream_t st, Split su, Split sd, bool pdl = true) {
    int t = T, h = H, k = KC;
    route(b, l, pdl, st);
    up<4, P>(b, l, su, pdl, st);
    down<8, P>(b, l, sd, pdl, st);
    void* ca[] = {&b.part, &b.x, &b.out, &t, &h, &k};
    launch((const void*)unmask_moe_combine, dim3((T * H + 255) / 256), dim3(256), 0, pdl, st, ca);
}

// Median microseconds a layer of `body` (called for l = 0..L-1 inside one captured graph).
template <class F>
static double per_layer(cudaStream_t st, F body) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < L; ++l) body(l);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, z;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&z));
    std::vector<float> ms;
    for (int i = 0; i < 23; ++i) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(z, st));
        CK(cudaEventSynchronize(z));
        float m;
        CK(cudaEventElapsedTime(&m, a, z));
        if (i >= 3) ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms[ms.size() / 2] * 1e3 / L;
}

// Sweeps the split of a dense product [n, k] (NORM or ADD form) over L layers, the weights in
// rows and packed (kernels/gemv.cu's unmask_repack, as the model loads them); prints each and
// the best of each layout. (src/model/gemv.rs MEASURED_PACKED takes SDAR-30B-A3B's q|k|v split
// from this sweep; its o keeps the rule's (within 1 % of the best) and its router, kept in
// rows, the rule's too, the rows' best.)
template <bool NORM, bool ADD>
static void dense_sweep(const char* name, int n, int k, cudaStream_t st, const bf* x, bf* y, const bf* res) {
    std::vector<bf*> w(L), pw(L);
    for (int l = 0; l < L; ++l) {
        CK(cudaMalloc(&w[l], (long)n * k * 2));
        CK(cudaMalloc(&pw[l], (long)n * k * 2));
        fill<<<1024, 256>>>(w[l], (long)n * k, 31 + l, 0.05f);
        unmask_repack<<<1024, 256>>>((const uint4*)w[l], (uint4*)pw[l], n, k / 8, 1);
    }
    CK(cudaDeviceSynchronize());
    const double mb = (double)n * k * 2 / 1e6;
    printf("\n%s [%d, %d] (%.1f MB a layer), layout u/ks/tb: us a layer, TB/s\n", name, n, k, mb);
    for (int packed = 0; packed < 2; ++packed) {
        double best = 1e30;
        int bu = 0, bks = 0, btb = 0;
        for (int u : {4, 8})
            for (int ks : {1, 2, 4, 8, 16})
                for (int tb : {1, 2, 4, 8}) {
                    if (ks * tb > 16 || ks > k / 32) continue;
                    int t = T, nn = n, k8 = k / 8, kss = ks;
                    float eps = 1e-6f;
                    const int sm = smem(k, ks, tb, 4, NORM);
                    auto f = packed ? (u == 8 ? (const void*)dense_k<8, NORM, ADD, true> : (const void*)dense_k<4, NORM, ADD, true>)
                                    : (u == 8 ? (const void*)dense_k<8, NORM, ADD, false> : (const void*)dense_k<4, NORM, ADD, false>);
                    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
                    std::vector<bf*>& ws = packed ? pw : w;
                    const double us = per_layer(st, [&](int l) {
                        void* args[] = {&ws[l], (void*)&x, &y, (void*)&res, &t, &nn, &k8, &kss, &eps};
                        launch(f, dim3((n + 16 * tb - 1) / (16 * tb)), dim3(32 * ks * tb), sm, false, st, args);
                    });
                    printf("  %s %d/%d/%d: %.2f us, %.2f TB/s\n", packed ? "packed" : "rows", u, ks, tb, us, mb / us);
                    if (us < best) best = us, bu = u, bks = ks, btb = tb;
                }
        printf("  best %s %s: %d/%d/%d %.2f us\n", name, packed ? "packed" : "rows", bu, bks, btb, best);
    }
    for (bf* p : w) CK(cudaFree(p));
    for (bf* p : pw) CK(cudaFree(p));
}

// The grouped kernels' splits swept alone (the tables written before) and in the four-kernel
// chain under PDL, the experts in rows or (P) packed.
template <bool P>
static void expert_sweeps(Bufs& b, int distinct, cudaStream_t st) {
    const double up_mb = distinct * 2.0 * I * H * 2 / 1e6, down_mb = distinct * 1.0 * H * I * 2 / 1e6;
    printf("\n%s: gate|up (%.1f MB a layer), split u/ks/tb: us a layer, TB/s\n", P ? "packed" : "rows", up_mb);
    const Split ups[] = {{4, 8, 1}, {4, 4, 1}, {4, 4, 2}, {4, 2, 2}, {4, 2, 4}, {4, 16, 1}, {8, 4, 1}, {8, 2, 2}, {8, 8, 1}, {2, 8, 1}, {2, 16, 1}};
    for (Split s : ups) {
        double us = s.u == 8 ? per_layer(st, [&](int l) { up<8, P>(b, l, s, false, st); })
                  : s.u == 4 ? per_layer(st, [&](int l) { up<4, P>(b, l, s, false, st); })
                             : per_layer(st, [&](int l) { up<2, P>(b, l, s, false, st); });
        printf("  %d/%d/%d: %.2f us, %.2f TB/s\n", s.u, s.ks, s.tb, us, up_mb / us);
    }
    printf("\ndown (%.1f MB a layer), split u/ks/tb: us a layer, TB/s\n", down_mb);
    const Split downs[] = {{8, 8, 1}, {8, 3, 1}, {8, 3, 2}, {8, 3, 4}, {8, 2, 2}, {8, 2, 4}, {4, 6, 1}, {4, 6, 2}, {4, 4, 2}, {4, 2, 4}, {8, 1, 8}, {4, 12, 1}};
    for (Split s : downs) {
        double us = s.u == 8 ? per_layer(st, [&](int l) { down<8, P>(b, l, s, false, st); })
                             : per_layer(st, [&](int l) { down<4, P>(b, l, s, false, st); });
        printf("  %d/%d/%d: %.2f us, %.2f TB/s\n", s.u, s.ks, s.tb, us, down_mb / us);
    }
    const Split cur_up = {4, 4, 2}, cur_down = {8, 2, 4};  // src/model/gemv.rs grouped_split
    printf("\nchain route -> up -> down -> combine under PDL, us a layer:\n");
    printf("  model splits (up 4/4/2, down 8/2/4): %.2f\n", per_layer(st, [&](int l) { four_kernels<P>(b, l, st, cur_up, cur_down); }));
    double best = 1e30;
    Split bu = cur_up, bd = cur_down;
    for (Split su : ups)
        for (Split sd : downs) {
            if (su.u != 4 || sd.u != 8) continue;  // the kernels the model instantiates
            const double us = per_layer(st, [&](int l) { four_kernels<P>(b, l, st, su, sd); });
            printf("  up %d/%d/%d down %d/%d/%d: %.2f\n", su.u, su.ks, su.tb, sd.u, sd.ks, sd.tb, us);
            if (us < best) best = us, bu = su, bd = sd;
        }
    // the chain's best grouped splits, in grouped_split's terms (src/model/gemv.rs)
    printf("BEST_CHAIN %s %d/%d,%d/%d %.2f\n", P ? "packed" : "rows", bu.ks, bu.tb, bd.ks, bd.tb, best);
}

int main(int argc, char** argv) {
    // `check`: only layer 0's chain, under PDL and one kernel after another, compared bit for
    // bit (quick enough for compute-sanitizer --tool racecheck / synccheck)
    const bool check = argc > 1 && strcmp(argv[1], "check") == 0;
    const int distinct = argc > 1 && !check ? atoi(argv[1]) : 9;
    if (distinct < 1 || distinct > E) {
        fprintf(stderr, "distinct experts: 1..%d, or `check`\n", E);
        return 2;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Bufs b;
    const long gu = (long)E * 2 * I * H, dn = (long)E * H * I;
    for (int l = 0; l < L; ++l) {
        bf *w1, *w2, *lg;
        CK(cudaMalloc(&w1, gu * 2));
        CK(cudaMalloc(&w2, dn * 2));
        fill<<<1024, 256>>>(w1, gu, 11 + l, 0.05f);
        fill<<<1024, 256>>>(w2, dn, 977 + l, 0.05f);
        // row t's j-th choice: expert pool[(2 t + j) % distinct], pool spread over the experts
        std::vector<bf> h((size_t)T * E);
        for (int t = 0; t < T; ++t)
            for (int i = 0; i < E; ++i) h[t * E + i] = host_bf16(-4.0f + (float)((i * 37 + t * 11 + l) % 50) / 25.0f);
        for (int t = 0; t < T; ++t)
            for (int j = 0; j < KC; ++j) {
                const int ex = (((2 * t + j) % distinct) * 53 + l * 7) % E;
                h[t * E + ex] = host_bf16(8.0f - 0.5f * j);
            }
        CK(cudaMalloc(&lg, h.size() * 2));
        CK(cudaMemcpy(lg, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
        b.gate_up.push_back(w1);
        b.down.push_back(w2);
        b.logits.push_back(lg);
    }
    CK(cudaMalloc(&b.tabs, sizeof(MoeTable) * L));
    CK(cudaMalloc(&b.stats, 16));
    CK(cudaMemset(b.stats, 0, 16));
    CK(cudaMalloc(&b.x, T * H * 2));
    CK(cudaMalloc(&b.act, T * KC * I * 2));
    CK(cudaMalloc(&b.out, T * H * 2));
    CK(cudaMalloc(&b.part, T * KC * H * 4));
    fill<<<64, 256>>>(b.x, T * H, 5, 2.0f);
    CK(cudaDeviceSynchronize());
    for (int l = 0; l < L; ++l) route(b, l, false, st);
    CK(cudaStreamSynchronize(st));
    MoeTable t0;
    CK(cudaMemcpy(&t0, b.tabs, sizeof t0, cudaMemcpyDeviceToHost));
    printf("layer 0 table: %d distinct experts (asked %d), k %d; row 0 picks", t0.count, distinct, t0.k);
    for (int j = 0; j < KC; ++j) printf(" %d(%.3f)", t0.topk[j], t0.weight[j]);
    printf("\n");
    if (check) {
        std::vector<bf> serial(T * H), chained(T * H);
        four_kernels<false>(b, 0, st, {4, 4, 2}, {8, 2, 4}, false);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(serial.data(), b.out, T * H * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemset(b.out, 0, T * H * 2));
        four_kernels<false>(b, 0, st, {4, 4, 2}, {8, 2, 4}, true);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(chained.data(), b.out, T * H * 2, cudaMemcpyDeviceToHost));
        int differ = 0;
        for (int i = 0; i < T * H; ++i) differ += serial[i] != chained[i];
        printf("CHECK chain under PDL vs one kernel after another: %d of %d outputs differ\n", differ, T * H);
        return differ ? 1 : 0;
    }
    expert_sweeps<false>(b, distinct, st);
    // each expert re-laid out in place, as the model loads them (src/model/moe.rs, MoeBlock::pack)
    bf* tmp;
    CK(cudaMalloc(&tmp, 2L * I * H * 2));
    for (int l = 0; l < L; ++l)
        for (int x = 0; x < E; ++x) {
            bf* g = b.gate_up[l] + (long)x * 2 * I * H;
            unmask_repack<<<1024, 256>>>((const uint4*)g, (uint4*)tmp, 2 * I, H / 8, 1);
            CK(cudaMemcpy(g, tmp, 2L * I * H * 2, cudaMemcpyDeviceToDevice));
            bf* d = b.down[l] + (long)x * H * I;
            unmask_repack<<<1024, 256>>>((const uint4*)d, (uint4*)tmp, H, I / 8, 1);
            CK(cudaMemcpy(d, tmp, (long)H * I * 2, cudaMemcpyDeviceToDevice));
        }
    CK(cudaDeviceSynchronize());
    CK(cudaFree(tmp));
    expert_sweeps<true>(b, distinct, st);
    if (argc > 2) {  // the layer's dense products too (free the experts first: 58 GB)
        for (int l = 0; l < L; ++l) {
            CK(cudaFree(b.gate_up[l]));
            CK(cudaFree(b.down[l]));
        }
        bf *big_x, *big_y;
        CK(cudaMalloc(&big_x, T * 4096 * 2));
        CK(cudaMalloc(&big_y, T * 8192 * 2));
        fill<<<64, 256>>>(big_x, T * 4096, 7, 2.0f);
        dense_sweep<true, false>("router (norm)", E, H, st, big_x, big_y, nullptr);
        dense_sweep<true, false>("q|k|v (norm)", 5120, H, st, big_x, big_y, nullptr);
        dense_sweep<false, true>("o (add)", H, 4096, st, big_x, big_y, big_x);
    }
    return 0;
}
