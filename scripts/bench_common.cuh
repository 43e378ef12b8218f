// What the GPU microbenchmarks (scripts/gemv_bench.cu, moe_bench.cu, packed_bench.cu) share: a
// CUDA call checked, a fill of deterministic bf16 noise, the largest relative difference of two
// bf16 buffers, SDAR's dense shapes and the model's gemv split for them, a launch of any gemv
// form, a stand-in for attention. Include after kernels/gemv.cu (to_bf16, gemv).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
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

// SDAR's dense shapes: layers, hidden, q heads x 128, k and v heads x 128, intermediate.
struct Shape {
    const char* name;
    int layers, hidden, q, kv, inter;
};

// The shape GEMV_SHAPE names (1.7b, 4b or 8b; default 1.7b); any other value is refused.
static Shape bench_shape() {
    const Shape shapes[] = {{"1.7b", 28, 2048, 2048, 1024, 6144}, {"4b", 36, 2560, 4096, 1024, 9728}, {"8b", 36, 4096, 4096, 1024, 12288}};
    const char* want = getenv("GEMV_SHAPE");
    if (!want || !*want) return shapes[0];
    for (const Shape& c : shapes)
        if (!strcmp(want, c.name)) return c;
    fprintf(stderr, "GEMV_SHAPE=%s: not a shape here (1.7b, 4b, 8b)\n", want);
    exit(2);
}

// The split src/model/gemv.rs's split() picks for `n` output rows of `k` inputs (a paired
// gate|up form: n rows of each half): steps of loads a batch, warps on a tile's K, tiles a block.
struct Split {
    int u, ks, tb;
};
static Split gemv_split(int n, int k, bool pair, bool packed = false) {
    // src/model/gemv.rs's MEASURED_PACKED (packed weights) then MEASURED: (n, k, pair) -> u, ks, tb
    struct M { int n, k; bool pair; Split s; };
    const M measured_packed[] = {
        {4096, 2048, false, {4, 16, 1}}, {5120, 2048, false, {8, 4, 2}}, {6144, 2560, false, {4, 8, 2}}, {2560, 4096, false, {4, 8, 2}},
        {9728, 2560, true, {4, 8, 1}}, {2560, 9728, false, {8, 8, 2}}, {4096, 4096, false, {8, 8, 2}},
        {12288, 4096, true, {4, 8, 1}}, {4096, 12288, false, {8, 8, 2}}};
    const M measured[] = {
        {6144, 2560, false, {8, 4, 2}}, {9728, 2560, true, {4, 8, 1}}, {2560, 9728, false, {8, 8, 2}},
        {6144, 4096, false, {8, 8, 1}}, {12288, 4096, true, {8, 4, 1}}};
    if (packed)
        for (const auto& m : measured_packed)
            if (m.n == n && m.k == k && m.pair == pair) return m.s;
    for (const auto& m : measured)
        if (m.n == n && m.k == k && m.pair == pair) return m.s;
    const int steps = k / 32, w_rows = pair ? 2 * n : n;
    int ks = 8, tb = 1;
    if (steps >= 128) ks = 16, tb = 1;
    else if (w_rows >= 8192) ks = 4, tb = 2;
    else if (w_rows >= 4096) ks = 8, tb = 2;
    return {pair ? 4 : 8, std::max(1, std::min(ks, steps)), tb};
}

// Rows a launch multiplies (gemv_bench.cu varies it; 4 elsewhere).
static int T = 4;

// Any form of kernels/gemv.cu's gemv at any batch depth, either layout (the kernel file
// compiles only the forms the model uses).
template <int U, bool PAIR, bool NORM, bool ADD, bool PACKED = false>
__global__ void gk(const uint4* w, const uint4* x, unsigned short* y, const unsigned short* res, int t_len, int n,
                   int k8, int ks, float eps) {
    gemv<U, PAIR, NORM, ADD, GRP_NONE, PACKED>(w, x, y, res, t_len, n, k8, ks, eps);
}

typedef void (*GemvFn)(const uint4*, const uint4*, unsigned short*, const unsigned short*, int, int, int, int, float);

// One launch of any form (norm: a norm form, its weight folded into W; res: the residual or null).
static cudaError_t launch_form(GemvFn f, int ks, int tb, bool pair, const bf* w, const bf* x, bf* y, bool norm,
                               const bf* res, int n, int k, bool pdl, cudaStream_t st) {
    int tiles = (n + 15) / 16;
    size_t staged = (size_t)T * (k / 8 + 1) * 16;
    size_t smem = std::max(staged, ks > 1 ? (size_t)ks * tb * ((pair ? 8 : 4) + norm) * 32 * 4 : 0);
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t lc = launch_config(dim3((tiles + tb - 1) / tb), dim3(32 * ks * tb), smem, pdl, st, &at);
    return cudaLaunchKernelEx(&lc, f, (const uint4*)w, (const uint4*)x, (unsigned short*)y, (const unsigned short*)res, T,
                              n, k / 8, ks, 1e-6f);
}

// Microseconds a replay of graph `ge` takes: 3 replays to warm up, then the mean of `reps`.
static float time_graph(cudaGraphExec_t ge, cudaStream_t st, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1000.f / reps;  // us per replay
}

// `body`'s launches captured into one CUDA graph, timed by time_graph.
template <class F>
static float capture_and_time(cudaStream_t st, F body, int reps = 30) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    body();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    float us = time_graph(ge, st, reps);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return us;
}

// Stand-in for q/k prep + attention between the q|k|v and o projections: 64 blocks that wait for
// the kernel before, let the next launch, and spin for `ns` nanoseconds (HBM left idle).
__device__ void spin_for(int ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < (unsigned long long)ns);
}
__global__ void spin_kernel(int ns) {
    dependency_wait();
    launch_dependents();
    spin_for(ns);
}

// spin_kernel as q/k prep + attention would launch: 64 blocks of 512 threads, under PDL.
static void launch_spin(cudaStream_t st, int ns) {
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(64);
    lc.blockDim = dim3(512);
    lc.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = at;
    lc.numAttrs = 1;
    CK(cudaLaunchKernelEx(&lc, spin_kernel, ns));
}
