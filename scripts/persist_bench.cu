// Does a persistent kernel stream a block pass's weights faster than a chain of gemv launches?
//
//   nvcc -O3 -arch=sm_90 -o /tmp/persist_bench scripts/persist_bench.cu && /tmp/persist_bench
//   GEMV_SHAPE=4b /tmp/persist_bench    # or 8b: SDAR-4B's or SDAR-8B's projections (default 1.7b)
//   PERSIST_SPIN_US=10 ...              # the attention stand-in's length (0: none; default 10)
//
// The question behind it (docs/perf.md, session 12): at SDAR-1.7B a projection kernel of the
// streamed layer moves its weights at 1.9-3.1 TB/s against a copy bandwidth of 4.2, and the
// gemv chain of a forward (28 layers x q|k|v, o, gate|up, down) at 2.6 TB/s under programmatic
// dependent launch: each kernel pays its launch, its first loads' latency and its last wave's
// tail. Asking the L2 for the next weights during those gaps made every forward slower. Here
// one cooperative launch runs the whole chain: every block stays resident, takes the tiles of
// each projection in turn (a projection is a phase), and between phases waits at a grid-wide
// barrier, but only after it has asked for its first batch of the next phase's weights, which no
// phase writes. So HBM keeps streaming across what were kernel boundaries, and no launch is paid.
//
// Each tile is the product of kernels/gemv.cu (mma.sync m16n8k16, a warp's 16 rows x 32 k a
// step, U = 8 steps of loads a batch, KS warps a tile summed in shared memory), plain form, x
// staged once a phase a block. Prints the chain of the existing kernel under PDL (the model's
// splits) beside the persistent chain at several splits and blocks a SM, both in us per forward
// and TB/s of weights, and checks one layer of the persistent chain against the existing kernel.
// Each twice: the projections alone, and with a stand-in for q/k prep + attention between q|k|v
// and o (HBM idle for PERSIST_SPIN_US: in the chain a spin kernel under PDL, as gemv_bench.cu's;
// in the persistent kernel every block spins after the o phase's barrier, its first batch of o's
// weights in flight), which is where the real layer leaves HBM idle.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../kernels/gemv.cu"

#include "bench_common.cuh"

// One projection of the chain: y [t, n] = x [t, k] . W^T, W [n, k] bf16, k8 = k / 8; ks warps
// a tile (8 / ks tiles a block).
struct Phase {
    const uint4* w;
    const uint4* x;
    unsigned short* y;
    int n, k8, ks;
    int spin_ns;  // the attention stand-in, after this phase's barrier (0: none)
};

#define WARPS 8  // a block: 256 threads
#define PU 8     // steps of loads a batch

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Arrivals are counted in one word: a block arrives once a phase, after its writes of that phase,
// and waits for phase ph's input until base + ph x gridDim.x arrivals (base: the arrivals of the
// launches before, so the word is never reset between timed launches). Every block waits at every phase
// (also one with no tile in it), so no block arrives twice before another has arrived once, and
// ph x gridDim.x arrivals mean that every block has finished phases 0 .. ph - 1.
__global__ void __launch_bounds__(32 * WARPS) persistent_chain(const Phase* __restrict__ phases, int n_phases,
                                                               unsigned* ctr, unsigned base, int t_len, int max_k8) {
    extern __shared__ uint4 smem[];
    uint4* xs = smem;                                        // [t_len][max_k8 + 1]
    float* part = (float*)(smem + (long)t_len * (max_k8 + 1));  // [WARPS][4][32]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int ph = 0; ph < n_phases; ++ph) {
        const Phase P = phases[ph];
        const int ks = P.ks, k8 = P.k8, n = P.n, steps = k8 / 4, xrow = k8 + 1;
        const int per_block = WARPS / ks, nvb = ((n + 15) / 16 + per_block - 1) / per_block;
        bool waited = false;
        for (int vb = blockIdx.x;; vb += gridDim.x) {
            const bool work = vb < nvb;
            if (!work && waited) break;
            const int n0 = (vb * per_block + warp / ks) * 16, kw = warp % ks;
            const long r0 = min(n0 + g, n - 1), r8 = min(n0 + g + 8, n - 1);
            const uint4* w0 = P.w + r0 * k8 + q;
            const uint4* w8 = P.w + r8 * k8 + q;
            uint4 a[PU], b[PU];
#pragma unroll
            for (int u = 0; u < PU; ++u) {
                const int s = kw + ks * u;
                a[u] = b[u] = zero;
                if (work && s < steps) {
                    a[u] = ld_stream(w0 + 4 * s);
                    b[u] = ld_stream(w8 + 4 * s);
                }
            }
            if (!waited) {
                // the first batch is in flight: now wait for the phase before, then stage x
                if (threadIdx.x == 0) {
                    const unsigned target = base + (unsigned)ph * gridDim.x;
                    while (ld_acquire(ctr) < target) __nanosleep(20);
                    if (P.spin_ns > 0) spin_for(P.spin_ns);
                }
                __syncthreads();
                waited = true;
                if (!work) break;
                for (int i = threadIdx.x; i < t_len * k8; i += blockDim.x) cp_async16(xs + (i / k8) * xrow + i % k8, P.x + i);
                cp_async_wait_all();
                __syncthreads();
            }
            const bool live = g < t_len;
            const uint4* xr = xs + (live ? g : 0) * xrow + q;
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int s0 = kw, batch = 0; s0 < steps; s0 += ks * PU, ++batch) {
                if (batch > 0)
#pragma unroll
                    for (int u = 0; u < PU; ++u) {
                        const int s = s0 + ks * u;
                        a[u] = b[u] = zero;
                        if (s < steps) {
                            a[u] = ld_stream(w0 + 4 * s);
                            b[u] = ld_stream(w8 + 4 * s);
                        }
                    }
#pragma unroll
                for (int u = 0; u < PU; ++u) {
                    const int s = s0 + ks * u;
                    const uint4 xv = (live && s < steps) ? xr[4 * s] : zero;
                    mma(c, a[u], b[u], xv.x, xv.y, false);
                    mma(c, a[u], b[u], xv.z, xv.w, true);
                }
            }
            if (ks > 1) {  // the tile's warps are consecutive: warp kw == 0 adds the others' sums
                float* mine = part + warp * 128;
#pragma unroll
                for (int i = 0; i < 4; ++i) mine[i * 32 + lane] = c[i];
                __syncthreads();
                if (kw == 0)
                    for (int o = 1; o < ks; ++o)
#pragma unroll
                        for (int i = 0; i < 4; ++i) c[i] += mine[o * 128 + i * 32 + lane];
            }
            if (kw == 0)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = n0 + g + (i >> 1) * 8, t = 2 * q + (i & 1);
                    if (t < t_len && row < n) P.y[(long)t * n + row] = to_bf16(c[i]);
                }
            if (ks > 1) __syncthreads();  // `part` is the next tile's
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(ctr, 1u);
        }
    }
}


static const int T = 4;  // rows of a denoising pass

// The existing kernel (plain form, U = 8), one projection, under PDL or not.
static void launch_gemv(const Phase& p, int tb, bool pdl, cudaStream_t st) {
    const int tiles = (p.n + 15) / 16;
    const size_t smem = std::max((size_t)T * (p.k8 + 1) * 16, (size_t)p.ks * tb * 4 * 32 * 4);
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t lc = launch_config(dim3((tiles + tb - 1) / tb), dim3(32 * p.ks * tb), smem, pdl, st, &at);
    CK(cudaLaunchKernelEx(&lc, unmask_gemv_u8, p.w, p.x, p.y, (const unsigned short*)nullptr, T, p.n, p.k8, p.ks, 0.0f));
}

int main() {
    const Shape S = bench_shape();
    const char* spin_env = getenv("PERSIST_SPIN_US");
    const int spin_ns = spin_env ? (int)(atof(spin_env) * 1000) : 10000;
    const int L = S.layers, HID = S.hidden, QKV = S.q + 2 * S.kv, INTER = S.inter;
    // q|k|v [QKV, HID], o [HID, q], gate|up [2 INTER, HID] (as one plain product), down [HID, INTER]
    const int N[4] = {QKV, HID, 2 * INTER, HID}, K[4] = {HID, S.q, HID, INTER};
    const long MAXN = 2L * INTER;  // the widest row of x or y
    int model_ks[4], model_tb[4];  // src/model/gemv.rs, split() (plain forms)
    for (int p = 0; p < 4; ++p) {
        const Split s = gemv_split(N[p], K[p], false);
        model_ks[p] = s.ks, model_tb[p] = s.tb;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("shape SDAR-%s: %d layers, hidden %d, q|k|v %d, intermediate %d; device %s, %d SMs\n", S.name, L, HID, QKV,
           INTER, prop.name, prop.multiProcessorCount);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaFuncSetAttribute(unmask_gemv_u8, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
    CK(cudaFuncSetAttribute(persistent_chain, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
    std::vector<bf*> W[4];
    double bytes = 0;
    for (int p = 0; p < 4; ++p)
        for (int l = 0; l < L; ++l) {
            bf* w;
            CK(cudaMalloc(&w, 2L * N[p] * K[p]));
            fill<<<1024, 256>>>(w, (long)N[p] * K[p], 1234u + 97u * p + 7919u * l, 0.25f);
            W[p].push_back(w);
            bytes += 2.0 * N[p] * K[p];
        }
    // x0 -> q|k|v -> qkv; attn (a stand-in for attention's output) -> o -> mid; mid -> gate|up
    // -> gu; act (a stand-in for silu(gate) * up) -> down -> x0, the next layer's input
    bf *x0, *qkv, *attn, *mid, *gu, *act, *save, *ref;
    for (bf** b : {&x0, &qkv, &attn, &mid, &gu, &act, &save}) CK(cudaMalloc(b, 2L * 8 * MAXN));
    CK(cudaMalloc(&ref, 2L * 2 * 8 * MAXN));  // two references: mid (or any), gate|up
    bf* ref_gu = ref + 8 * MAXN;
    fill<<<64, 256>>>(x0, 8L * HID, 42u, 2.0f);
    fill<<<64, 256>>>(attn, 8L * S.q, 43u, 2.0f);
    fill<<<64, 256>>>(act, 8L * INTER, 44u, 2.0f);
    CK(cudaMemcpy(save, x0, 2L * 8 * HID, cudaMemcpyDeviceToDevice));
    CK(cudaDeviceSynchronize());
    printf("weights a forward: %.1f MB (%d layers)\n", bytes / 1e6, L);
    const bf* ins[4] = {x0, attn, mid, act};
    bf* outs[4] = {qkv, mid, gu, x0};
    auto chain = [&](const int* ks, int spin) {
        std::vector<Phase> ph;
        for (int l = 0; l < L; ++l)
            for (int p = 0; p < 4; ++p)
                ph.push_back({(const uint4*)W[p][l], (const uint4*)ins[p], outs[p], N[p], K[p] / 8, ks[p], p == 1 ? spin : 0});
        return ph;
    };
    auto time = [&](auto body, int reps) {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        for (int i = 0; i < 3; ++i) body();
        CK(cudaEventRecord(a, st));
        for (int i = 0; i < reps; ++i) body();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        return ms * 1000.0f / reps;
    };
    auto report = [&](const char* what, float us) { printf("%-64s %8.1f us a forward  %.2f TB/s\n", what, us, bytes / (us * 1e-6) / 1e12); };

    // the chain of the existing kernel, the model's splits, as a CUDA graph, with and without PDL,
    // without and with the attention stand-in
    const std::vector<Phase> model = chain(model_ks, 0);
    for (int spin = 0; spin < 2; ++spin) {
        if (spin && spin_ns == 0) break;
        for (int pdl = 0; pdl < 2; ++pdl) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (size_t i = 0; i < model.size(); ++i) {
                if (spin && i % 4 == 1) launch_spin(st, spin_ns);
                launch_gemv(model[i], model_tb[i % 4], pdl, st);
            }
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            float us = time([&] { CK(cudaGraphLaunch(ge, st)); }, 20);
            char what[96];
            snprintf(what, sizeof what, "kernel chain, graph, %s%s", pdl ? "PDL (the model's)" : "no PDL",
                     spin ? ", attention stand-in" : "");
            report(what, us);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
    }
    // what a whole forward leaves in the four outputs: the last layer's products (x0: the down
    // product's, which the next forward's first layer reads), to check the persistent runs by
    bf* golden[4];
    for (int i = 0; i < 4; ++i) {
        CK(cudaMalloc(&golden[i], 2L * 8 * MAXN));
        CK(cudaMemcpyAsync(golden[i], outs[i], 2L * 8 * MAXN, cudaMemcpyDeviceToDevice, st));
    }
    CK(cudaStreamSynchronize(st));

    Phase* dph;
    CK(cudaMalloc(&dph, sizeof(Phase) * 4 * L));
    unsigned* ctr;
    CK(cudaMalloc(&ctr, 4));
    const int max_k8 = *std::max_element(K, K + 4) / 8;
    const size_t smem = (size_t)T * (max_k8 + 1) * 16 + WARPS * 128 * 4;
    int fits = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fits, persistent_chain, 32 * WARPS, smem));
    printf("persistent: %zu bytes of shared memory a block, %d blocks fit a SM\n", smem, fits);
    if (fits < 1) {
        printf("FAILED: the persistent kernel does not fit a SM\n");
        return 1;
    }
    unsigned arrived = 0;  // what the counter holds once the launches so far have ended
    CK(cudaMemsetAsync(ctr, 0, 4, st));
    auto run = [&](int n_phases, int grid) {
        int t = T, np = n_phases, mk = max_k8;
        unsigned b = arrived;
        void* args[] = {&dph, &np, &ctr, &b, &t, &mk};
        CK(cudaLaunchCooperativeKernel((void*)persistent_chain, dim3(grid), dim3(32 * WARPS), args, smem, st));
        arrived += (unsigned)(n_phases * grid);
    };
    bool failed = false;

    // one layer against the existing kernel
    {
        const int ks[4] = {8, 8, 4, 8};
        const std::vector<Phase> ph = chain(ks, 0);
        // on `st`, which does not wait for the default stream
        CK(cudaMemcpyAsync(dph, ph.data(), sizeof(Phase) * 4, cudaMemcpyHostToDevice, st));
        CK(cudaMemcpyAsync(x0, save, 2L * 8 * HID, cudaMemcpyDeviceToDevice, st));
        run(4, prop.multiProcessorCount * fits);
        CK(cudaStreamSynchronize(st));
        // reference, from the same inputs: x0 (saved), attn, the reference mid (which the
        // o product leaves in `ref` for gate|up to read), act; each output against its own
        Phase r[4] = {ph[0], ph[1], ph[2], ph[3]};
        r[0].x = (const uint4*)save;
        r[2].x = (const uint4*)ref;
        bf* const want[4] = {ref, ref, ref_gu, ref};
        double err[4];
        for (int p = 0; p < 4; ++p) {
            r[p].y = want[p];
            launch_gemv(r[p], 1, false, st);
            CK(cudaStreamSynchronize(st));
            err[p] = max_rel(outs[p], want[p], (long)T * N[p]);
        }
        // the same splits, so the same sums in the same order: equal bit for bit
        const bool same = std::max({err[0], err[1], err[2], err[3]}) == 0.0;
        failed |= !same;
        printf("persistent, one layer, against the kernel with the same splits: max rel. error q|k|v %.2e, o %.2e, gate|up %.2e, down %.2e%s\n",
               err[0], err[1], err[2], err[3], same ? " (equal)" : "  FAIL");
    }

    // the whole forward, several splits (ks a tile for q|k|v, o, gate|up, down; each divides the
    // block's 8 warps) and blocks a SM, without and with the attention stand-in
    const int splits[][4] = {{8, 8, 4, 8}, {8, 8, 8, 8}, {4, 4, 4, 8}, {8, 8, 2, 8}, {2, 2, 2, 4}};
    for (int spin = 0; spin < 2; ++spin) {
        if (spin && spin_ns == 0) break;
        for (const auto& ks : splits) {
            const std::vector<Phase> ph = chain(ks, spin ? spin_ns : 0);
            CK(cudaMemcpyAsync(dph, ph.data(), sizeof(Phase) * ph.size(), cudaMemcpyHostToDevice, st));
            for (int per_sm = 1; per_sm <= fits; ++per_sm) {
                const int grid = prop.multiProcessorCount * per_sm;
                float us = time([&] { run(4 * L, grid); }, 20);
                // after a whole forward every buffer holds the last layer's products, as after
                // the chain of launches (other splits: other summation orders, so within bf16
                // rounding)
                double err = 0;
                for (int i = 0; i < 4; ++i) err = std::max(err, max_rel(outs[i], golden[i], (long)T * N[i]));
                failed |= !(err < 2e-2);
                char what[96];
                snprintf(what, sizeof what, "persistent ks %d/%d/%d/%d, %d block(s) a SM%s", ks[0], ks[1], ks[2], ks[3], per_sm,
                         spin ? ", attention stand-in" : "");
                report(what, us);
                printf("    its last layer against the chain of launches: max rel. error %.2e%s\n", err, err < 2e-2 ? "" : "  FAIL");
            }
        }
    }
    CK(cudaDeviceSynchronize());
    printf(failed ? "FAILED\n" : "done\n");
    return failed ? 1 : 0;
}
