// y [T, N] = x [T, K] . W^T for the few rows of a block pass (T <= 8), W stored [N, K] (the
// checkpoint's own [out, in] layout), everything bf16, sums in f32, on the tensor cores.
// The paired form multiplies the gate and the up halves of a stacked [2 N, K] weight together
// and writes silu(gate) * up [T, N], so the MLP's activation costs no kernel of its own.
// NORM forms take x un-normalised and W with the RMSNorm's weight already folded in (W[n, k]
// w[k], src/model/qwen3.rs, fold_norms): they sum x's squares from the very fragments the
// products read and scale each output by its row's 1 / rms, so the norm costs neither a kernel
// nor a pass over x before the first product. ADD forms write bf16(bf16(y) + res), the residual
// add. With both, a Qwen3 layer is six kernels (src/model/qwen3.rs, forward_streamed).
//
// A block pass multiplies 4 or 8 rows, so it is bound by streaming W once from HBM; what
// matters is how many bytes are in flight and how soon the first ones are asked for.
//  - One mma.sync m16n8k16 multiplies a 16 x 16 tile of W by a 16 x 8 tile of x (T padded to
//    8), so instructions per weight byte are few and the same for any T <= 8.
//  - The dot product is a sum over k, so any permutation of k that A (W) and B (x) share gives
//    the same result. The fragment layout gives lane (g = lane / 4, q = lane % 4) the k slots
//    {2q, 2q+1, 2q+8, 2q+9} of rows g and g+8 of A and of column g of B; we feed those slots
//    from 8 consecutive k, k0 + 8q .. k0 + 8q + 7 of each row, one 16-byte load, so a warp
//    step covers 32 k of 16 rows (64 contiguous bytes a row) with two mma.
//  - A warp issues the W loads of U steps back to back before its first mma (a batch: 16 U
//    bytes a row a lane, U KiB a warp in flight), so it waits on memory once per batch, not
//    once per step (an earlier version of this kernel, one step per wait, reached 2.5 TB/s).
//  - Shapes are cut into many small blocks (src/model/gemv.rs picks the split), so the last
//    wave of blocks is short and every SM keeps streaming to the end.
//  - On sm_90, under programmatic dependent launch, a block asks for its first batch of W
//    (which no earlier kernel writes) before it waits for the kernel before it to finish, and
//    lets the next kernel launch at once: the weights of one projection start streaming while
//    the small kernels before it still run. Elsewhere both instructions compile away.
//    src/model/cuda/gemv.rs launches it so unless UNMASK_PDL=0 (src/model/cuda/launch.rs).
//
// Launch (gemv.rs): block = TB tiles x KS warps (32 TB KS threads); a tile is 16 output rows;
// the KS warps of a tile take its K steps in turn (warp kw: steps kw, kw + KS, ...) and add
// their sums through shared memory (4 floats a lane a warp, 8 for the paired form). grid =
// ceil(N / 16 / TB). K % 32 == 0 and x, W 16-byte aligned (the launcher checks). Dynamic shared
// memory: the staged x, or the K split's sums (and for NORM the sums of squares) if larger. Rows past N
// read row N-1 again (in bounds) and are never written.
// Math: products of bf16 values are exact in f32; sums in f32 in another order than
// src/model/gemv.rs's CPU body, so results agree before the final rounding to bf16.

#include "common.cuh"  // dependency_wait, launch_dependents, to_bf16, cp_async16, mma_bf16_16816, MoeTable
#include "moe.cuh"     // route_any, store_table: the routing before the grouped forms

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// A word of a MoE routing table, as an asm volatile load (the compiler keeps it where it is
// written, before any branch on it; plain loads it sank past the first): `l2` through L2 only
// (ld.global.cg), else through L1 too (ld.global.ca), where the blocks after the first on an
// SM find it.
__device__ __forceinline__ int table_word(const int* p, bool l2) {
    int v;
    if (l2) asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    else asm volatile("ld.global.ca.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// One 32-wide step's half (hi: k 4..7 of each lane's 8) of rows g (a) and g + 8 (b) times x.
__device__ __forceinline__ void mma(float* c, uint4 a, uint4 b, unsigned x0, unsigned x1, bool hi) {
    mma_bf16_16816(c, hi ? a.z : a.x, hi ? b.z : b.x, hi ? a.w : a.y, hi ? b.w : b.y, x0, x1);
}

__device__ __forceinline__ float bf16_round(float v) { return __uint_as_float(((unsigned)to_bf16(v)) << 16); }

__device__ __forceinline__ void unpack8(uint4 v, float* f) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

// PAIR: rows n0.. of the gate half (rows [0, n)) and of the up half (rows [n, 2 n)) together.
// NORM: x is the residual stream and W carries the norm weight: y = r_t (x . W^T), r_t = 1 /
// sqrt(mean(x_t^2) + eps), the sum of squares taken from the B fragments (each lane's k slots
// of its row g, over the K split: every x value exactly once) and reduced with the products.
// (Normalising the staged x first, a block-wide pass between the staging and the first
// product, measured slower: a whole pass over x on the critical path.)
// ADD: y = res + (x . W^T), the product rounded to bf16 first, then the sum (as an unfused
// projection then add rounds): the projection writes the next residual stream itself.
// GRP (MoE experts, grouped: one launch for every expert a pass touched): blockIdx.y is a
// distinct expert u of the routing table `tab` (blocks past its count return at once, so the
// grid's shape is fixed and a CUDA graph replays it); W is that expert's slice of the layer's
// stacked experts, and the block's columns are the rows routed to it. GRP_UP: x is the
// pass's residual stream [T, K] (PAIR, NORM: silu(gate) * up of the normed row) and y the
// activations [T * k, N] at the rows' slots. GRP_DOWN: x is those activations and the output
// is f32 [T * k, N], each slot's product times its routing weight.
#define GRP_NONE 0
#define GRP_UP 1
#define GRP_DOWN 2
// PACKED: W re-laid out tile by tile in the order the warps read it, [tile][step][A row g | row
// g + 8][lane] 16-byte fragments (src/model/gemv.rs, `pack`: the tensor [N / 16, K / 32, 16, 32]),
// so a warp's load is 512 contiguous bytes instead of 8 rows' 64-byte runs K apart, and a tile's
// weights one contiguous run. Same fragments, same sums: equal results. Faster the larger the
// shape (docs/tuning.md, "packed layout").
template <int U, bool PAIR, bool NORM, bool ADD, int GRP = GRP_NONE, bool PACKED = false>
__device__ void gemv(const uint4* __restrict__ w, const uint4* __restrict__ x, unsigned short* __restrict__ y,
                     const unsigned short* __restrict__ res, int t_len, int n, int k8, int ks, float eps,
                     const MoeTable* __restrict__ tab = nullptr, float* __restrict__ yf = nullptr) {
    // x [t_len, K] staged once per block, rows XROW uint4 apart (one pad: the 8 rows a warp
    // reads at the same k fall in different banks); then the sums of the K split.
    extern __shared__ uint4 xs[];
    if (GRP != GRP_UP) launch_dependents();  // GRP_UP signals after its wait (GRP below)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tile = blockIdx.x * ((blockDim.x >> 5) / ks) + warp / ks, kw = warp % ks;
    const int g = lane >> 2, q = lane & 3;
    const int n0 = tile * 16;
    // GRP: the block's columns (x rows) and the slot each writes, from the route kernel's table.
    // GRP_UP: the table is the previous kernel's output, so wait before the first weight load
    // (which needs the expert), then let the down kernel launch. GRP_DOWN: the route kernel
    // finished before this kernel launched (gate|up signals after its wait), so read the table
    // and load the expert's weights before waiting for the activations (through L2 alone: no
    // kernel boundary with the writer's has passed that would have dropped this SM's L1 copy of
    // an older table; PDL promises visibility only after griddepcontrol.wait, so this rests on
    // the writer having finished, flushed, before this grid launched, and L2 being where global
    // memory is coherent). This takes a cold start off the sparse layer's chain (docs/tuning.md).
    // The blocks past the count return at once (block 0 always
    // lives and waits, so this kernel's end still implies the previous one's).
    // GRP_UP asks for every table word it needs at once, after its wait: one round trip to the
    // L2 before its first weight load, where the count, then the expert, then the chosen rows'
    // slots took three, and through L1, so that the blocks without an expert (most of the grid)
    // find the count there and leave their SM sooner (through L2 alone it was slower: the
    // grid's empty blocks each waited on the L2 before leaving; docs/tuning.md).
    int cols = t_len, slot_of[8], kc = 1;  // GRP_UP: kc, the choices a row
    if (GRP == GRP_UP) {
        dependency_wait();
        launch_dependents();
        const int u = blockIdx.y;
        const int count = table_word(&tab->count, false), ex = table_word(&tab->expert[u], false);
        const unsigned m = (unsigned)table_word((const int*)&tab->rows[u], false);
        int sl[8];  // slot[u] has 8 words, read whether or not their rows chose u
#pragma unroll
        for (int t = 0; t < 8; ++t) sl[t] = table_word(&tab->slot[u][t], false);
        kc = table_word(&tab->k, false);
        if (count <= u) return;
        w += (long)ex * (PAIR ? 2 * n : n) * k8;
        cols = 0;
#pragma unroll
        for (int t = 0; t < 8; ++t)
            if (t < t_len && ((m >> t) & 1u)) slot_of[cols++] = sl[t];
    }
    if (GRP == GRP_DOWN) {
        const int u = blockIdx.y;
        if (table_word(&tab->count, true) <= u) return;
        w += (long)table_word(&tab->expert[u], true) * (PAIR ? 2 * n : n) * k8;
        const unsigned m = (unsigned)table_word((const int*)&tab->rows[u], true);
        cols = 0;
        for (int t = 0; t < t_len; ++t)
            if ((m >> t) & 1u) slot_of[cols++] = table_word(&tab->slot[u][t], true);
    }
    const long r0 = min(n0 + g, n - 1), r8 = min(n0 + g + 8, n - 1);
    const int steps = k8 / 4;
    // uint4s from one step's fragment of a row to the next step's
    constexpr int SS = PACKED ? 64 : 4;
    const long pt = (long)min(tile, n / 16 - 1) * steps * 64 + lane;  // PACKED: n % 16 == 0
    const uint4* w0 = PACKED ? w + pt : w + r0 * k8 + q;
    const uint4* w8 = PACKED ? w + pt + 32 : w + r8 * k8 + q;
    // PAIR only: the up half (PACKED: its tiles follow the gate half's)
    const uint4* u0 = PACKED ? w0 + (long)(n / 16) * steps * 64 : w + (r0 + n) * k8 + q;
    const uint4* u8 = PACKED ? w8 + (long)(n / 16) * steps * 64 : w + (r8 + n) * k8 + q;
    const int XROW = k8 + 1;
    // Column g of B is x row g; rows past T multiply as zeros.
    const bool live = g < cols;
    const uint4* xr = xs + (live ? g : 0) * XROW + q;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cu[4] = {0.0f, 0.0f, 0.0f, 0.0f}, rv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float ss = 0.0f;  // NORM: this lane's share of x row g's sum of squares
    for (int s0 = kw, batch = 0; batch == 0 || s0 < steps; s0 += ks * U, ++batch) {
        uint4 a[U], b[U], au[U], bu[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = s0 + ks * u;
            a[u] = b[u] = au[u] = bu[u] = zero;
            if (s < steps) {
                a[u] = ld_stream(w0 + SS * s);
                b[u] = ld_stream(w8 + SS * s);
                if (PAIR) {
                    au[u] = ld_stream(u0 + SS * s);
                    bu[u] = ld_stream(u8 + SS * s);
                }
            }
        }
        if (batch == 0) {
            // W is in flight; x is the previous kernel's output, so wait for it, then stage it
            dependency_wait();
            const int total = cols * k8;
            for (int i = threadIdx.x; i < total; i += blockDim.x) {
                const int c = i / k8;
                // GRP_UP: residual row t = slot / k; GRP_DOWN: the slot's activation row
                const long src = GRP == GRP_NONE ? c : GRP == GRP_UP ? slot_of[c] / kc : slot_of[c];
                cp_async16(xs + c * XROW + i % k8, x + src * k8 + i % k8);
            }
            // ADD: this lane's residual values, asked for now so the epilogue does not wait
            if (ADD)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = n0 + g + (i >> 1) * 8, t = 2 * q + (i & 1);
                    if (t < t_len && row < n) rv[i] = __uint_as_float(((unsigned)res[(long)t * n + row]) << 16);
                }
            cp_async_wait_all();
            __syncthreads();
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = s0 + ks * u;
            const uint4 xv = (live && s < steps) ? xr[4 * s] : zero;
            if (NORM) {
                float f[8];
                unpack8(xv, f);
#pragma unroll
                for (int j = 0; j < 8; ++j) ss = fmaf(f[j], f[j], ss);
            }
            mma(c, a[u], b[u], xv.x, xv.y, false);
            mma(c, a[u], b[u], xv.z, xv.w, true);
            if (PAIR) {
                mma(cu, au[u], bu[u], xv.x, xv.y, false);
                mma(cu, au[u], bu[u], xv.z, xv.w, true);
            }
        }
    }
    if (NORM) {  // over the 4 lanes of row g, then (below) over the K split
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    }
    if (ks > 1) {
        const int np = (PAIR ? 8 : 4) + (NORM ? 1 : 0);
        float* part = (float*)xs;  // every warp is done with x after the barrier
        float* mine = part + warp * np * 32;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            mine[i * 32 + lane] = c[i];
            if (PAIR) mine[(4 + i) * 32 + lane] = cu[i];
        }
        if (NORM) mine[(np - 1) * 32 + lane] = ss;
        __syncthreads();
        if (kw != 0) return;
        for (int o = 1; o < ks; ++o) {
            const float* other = mine + o * np * 32;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                c[i] += other[i * 32 + lane];
                if (PAIR) cu[i] += other[(4 + i) * 32 + lane];
            }
            if (NORM) ss += other[(np - 1) * 32 + lane];
        }
    }
    // NORM: 1 / rms of x rows 2q and 2q + 1 (this lane's two columns), from lanes 8q and 8q + 4
    float rs[2] = {1.0f, 1.0f};
    if (NORM)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const float st = __shfl_sync(0xffffffffu, ss, 4 * (2 * q + j));
            rs[j] = 1.0f / sqrtf(st / (float)(8 * k8) + eps);
        }
    // c0, c1: row g, columns 2q, 2q+1; c2, c3: row g+8, the same columns. Column = x row.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = n0 + g + (i >> 1) * 8, t = 2 * q + (i & 1);
        if (t >= cols || row >= n) continue;
        float v = NORM ? c[i] * rs[i & 1] : c[i];
        if (GRP == GRP_DOWN) {
            const int sl = slot_of[t];
            yf[(long)sl * n + row] = bf16_round(v) * tab->weight[sl];
            continue;
        }
        if (PAIR) {
            // as the unfused chain rounds: gate and up to bf16, silu(gate) * up in f32
            const float gt = bf16_round(v), up = bf16_round(NORM ? cu[i] * rs[i & 1] : cu[i]);
            v = gt / (1.0f + expf(-gt)) * up;
        }
        const long at = (long)(GRP == GRP_UP ? slot_of[t] : t) * n + row;
        if (ADD) v = bf16_round(v) + rv[i];
        y[at] = to_bf16(v);
    }
}

// Each form twice: NAME reads W in the checkpoint's rows, NAME_p packed (PACKED above).
#define GEMV(NAME, U, PAIR, NORM, ADD)                                                                        \
    extern "C" __global__ void NAME(const uint4* w, const uint4* x, unsigned short* y, const unsigned short* res,    \
                                    int t_len, int n, int k8, int ks, float eps) {                            \
        gemv<U, PAIR, NORM, ADD>(w, x, y, res, t_len, n, k8, ks, eps);                                        \
    }                                                                                                         \
    extern "C" __global__ void NAME##_p(const uint4* w, const uint4* x, unsigned short* y,                    \
                                        const unsigned short* res, int t_len, int n, int k8, int ks, float eps) { \
        gemv<U, PAIR, NORM, ADD, GRP_NONE, true>(w, x, y, res, t_len, n, k8, ks, eps);                        \
    }

// plain; the residual-adding form (o, down); the normed-input forms (qkv; gate|up paired)
GEMV(unmask_gemv_u4, 4, false, false, false)
GEMV(unmask_gemv_u8, 8, false, false, false)
GEMV(unmask_gemv_silu_u4, 4, true, false, false)
GEMV(unmask_gemv_add_u8, 8, false, false, true)
GEMV(unmask_gemv_norm_u8, 8, false, true, false)
GEMV(unmask_gemv_norm_silu_u4, 4, true, true, false)
// 4 steps a batch for the normed and adding forms (packed splits, src/model/gemv.rs MEASURED_PACKED)
GEMV(unmask_gemv_norm_u4, 4, false, true, false)
GEMV(unmask_gemv_add_u4, 4, false, false, true)
// the paired forms with 8 steps a batch (SDAR-8B's gate|up, src/model/gemv.rs MEASURED)
GEMV(unmask_gemv_silu_u8, 8, true, false, false)
GEMV(unmask_gemv_norm_silu_u8, 8, true, true, false)

// MoE experts, grouped (GRP above; moe.cuh has the routing): a sparse layer after its router
// product is four kernels. unmask_moe_route (one block of 32 T threads, its scratch in the
// dynamic shared memory) writes the layer's table; gate|up and down multiply from it, grid
// (tiles, T * k); unmask_moe_combine sums each row's slots plus the residual. (Folding the
// routing into every gate|up block and the combine into down's last blocks was slower: the
// routing then ran in every block before it could tell it had no expert, and the combine
// waited on a column range's slowest block; docs/perf.md, "What was tried and lost".)
extern "C" __global__ void __launch_bounds__(256) unmask_moe_route(const unsigned short* logits, MoeTable* tab,
                                                                   unsigned long long* stats, int t_len, int e,
                                                                   int k, int norm) {
    __shared__ MoeTable s;
    launch_dependents();
    dependency_wait();
    route_any(logits, t_len, e, k, norm, &s, route_scratch());
    store_table(&s, tab, stats, t_len);
}
// The same for LLaDA2's grouped sigmoid router (moe.cuh, route_grouped_any): bias [e] f32, the
// experts in `groups` groups of which `keep` are kept, the weights times `scale`; its scratch
// ROUTE_GROUPED_SCRATCH_WORDS(e, t_len) words of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(256) unmask_moe_route_grouped(const unsigned short* logits,
                                                                           const float* bias, MoeTable* tab,
                                                                           unsigned long long* stats, int t_len,
                                                                           int e, int k, int groups, int keep,
                                                                           float scale) {
    __shared__ MoeTable s;
    launch_dependents();
    dependency_wait();
    route_grouped_any(logits, bias, t_len, e, k, groups, keep, scale, &s, route_scratch());
    store_table(&s, tab, stats, t_len);
}
template <int U, bool P>
__device__ void moe_up(const uint4* w, const uint4* x, unsigned short* y, const MoeTable* tab, int t_len, int n, int k8,
                       int ks, float eps) {
    gemv<U, true, true, false, GRP_UP, P>(w, x, y, nullptr, t_len, n, k8, ks, eps, tab, nullptr);
}
template <int U, bool P>
__device__ void moe_down(const uint4* w, const uint4* x, float* part, const MoeTable* tab, int t_len, int n, int k8,
                         int ks) {
    gemv<U, false, false, false, GRP_DOWN, P>(w, x, nullptr, nullptr, t_len, n, k8, ks, 0.0f, tab, part);
}
// out [T, H] = bf16(bf16(sum_j part[t * k + j]) + res[t]), one thread an element.
extern "C" __global__ void unmask_moe_combine(const float* __restrict__ part, const unsigned short* res,
                                              unsigned short* out, int t_len, int h, int k) {
    launch_dependents();
    dependency_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= t_len * h) return;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += part[(long)((i / h) * k + j) * h + i % h];
    out[i] = to_bf16(bf16_to_f32(to_bf16(sum)) + bf16_to_f32(res[i]));
}
// Each with the experts in rows and (_p) each expert packed (PACKED: `[E][tile][step][16][32]`).
#define MOE_ENTRIES(SUFFIX, P)                                                                                          \
    extern "C" __global__ void unmask_gemv_moe_up_u4##SUFFIX(const uint4* w, const uint4* x, unsigned short* y,          \
                                                             const MoeTable* tab, int t_len, int n, int k8, int ks,      \
                                                             float eps) {                                                \
        moe_up<4, P>(w, x, y, tab, t_len, n, k8, ks, eps);                                                              \
    }                                                                                                                   \
    extern "C" __global__ void unmask_gemv_moe_down_u8##SUFFIX(const uint4* w, const uint4* x, float* part,              \
                                                               const MoeTable* tab, int t_len, int n, int k8, int ks) {  \
        moe_down<8, P>(w, x, part, tab, t_len, n, k8, ks);                                                              \
    }
MOE_ENTRIES(, false)
MOE_ENTRIES(_p, true)

// A weight between the checkpoint's rows and the packed layout (PACKED above; src/model/gemv.rs
// `pack` and `unpack`), one 16-byte fragment a thread: i counts fragments in packed order,
// ((tile * steps + step) * 2 + half) * 32 + lane, which is row tile * 16 + lane / 4 + 8 half,
// fragment 4 step + lane % 4 of it. Reads and writes whole 64-byte runs of a row.
extern "C" __global__ void unmask_repack(const uint4* __restrict__ src, uint4* __restrict__ dst, int rows, int k8,
                                         int to_packed) {
    // launched under PDL like every kernel here: the kernel after it (cuBLAS, not under PDL)
    // waits only for this one, so this one waits for the one before it
    dependency_wait();
    const int steps = k8 / 4;
    const long total = (long)rows * k8;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const int lane = (int)(i % 32), half = (int)(i / 32 % 2), step = (int)(i / 64 % steps);
        const long tile = i / 64 / steps;
        const long r = (tile * 16 + lane / 4 + 8 * half) * k8 + 4 * step + lane % 4;
        if (to_packed) dst[i] = src[r];
        else dst[r] = src[i];
    }
}
