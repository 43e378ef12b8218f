// y [T, N] = x [T, K] . W^T for the few rows of a block pass (T <= 8), W stored [N, K] (the
// checkpoint's own [out, in] layout), everything bf16, sums in f32, on the tensor cores.
//
// A block pass multiplies 4 or 8 rows, so it is bound by streaming W once from HBM. Measured on
// the H200 (docs/perf.md): FMAs leave the loop issue-bound at T = 8 (1.7 TB/s); tensor-core
// fragments loaded straight from global memory read 64 scattered bytes per row per load and
// reach 2.5 TB/s. So each warp streams its 16-row tile of W through shared memory, 512
// contiguous bytes per row per load (cp.async, two stages so one is in flight while the other
// is multiplied), and feeds mma.sync m16n8k16 from there: A = 16 rows x 16 k of W, B = 16 k x 8
// columns of x (T padded to 8 with zeros), C in f32.
//
// The dot product is a sum over k, so any permutation of k that A and B share gives the same
// result. The fragment layout gives lane (g = lane / 4, q = lane % 4) the k slots {2q, 2q+1} and
// {2q+8, 2q+9} of rows g and g+8 of A and of column g of B; we feed them from k = 4q .. 4q+3 of
// the 16-k chunk, so each is one 8-byte load. Staged rows are 544 bytes apart (512 + 32), which
// spreads those 8-byte loads of a half-warp over all 32 banks.
//
// Launch (src/model/gemv.rs picks KS so that the grid fills the card):
//   block 256 threads = 8 warps; warps in groups of KS split K's 256-wide stages between them;
//   each group owns a tile of 16 consecutive output rows, so a block covers 16 * 8 / KS rows;
//   grid ceil(N / that); dynamic shared memory SMEM_BYTES. K % 256 == 0 and x, W 16-byte
//   aligned (the launcher checks; otherwise cuBLAS runs instead). Rows past N read row N-1 again
//   (in bounds) and are never written.
// Math: products of bf16 values are exact in f32; sums in f32 in another order than
// src/model/gemv.rs's CPU body, so results agree before the final rounding to bf16.

#define WARPS 8
#define TILE 16                       // rows per warp group
#define STAGE_K 256                   // k per stage: 512 bytes of each row
#define STAGES 2
#define ROW_BYTES 544                 // a staged row, padded against bank conflicts
#define WARP_BYTES (STAGES * TILE * ROW_BYTES)
// SMEM_BYTES = WARPS * WARP_BYTES = 139264 (src/model/gemv_cuda.rs sets the same)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

__device__ __forceinline__ void mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                    unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned short to_bf16(float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                      // round to nearest even
    return (unsigned short)(u >> 16);
}

template <int KS>
__device__ void gemv(const unsigned short* __restrict__ w, const unsigned short* __restrict__ x,
                     unsigned short* __restrict__ y, int t_len, int n, int k) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float part[WARPS][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = warp / KS, kw = warp % KS;
    const int g = lane >> 2, q = lane & 3;
    const int n0 = (blockIdx.x * (WARPS / KS) + group) * TILE;
    unsigned char* buf = smem + warp * WARP_BYTES;
    const unsigned buf_s = smem_addr(buf);
    const int stages = k / STAGE_K;

    // Stage `st` (k from st * STAGE_K) of the tile's 16 rows into buffer b: row r by one
    // 512-byte load of the whole warp (16 bytes a lane).
    auto issue = [&](int st, int b) {
        const long k0 = (long)st * STAGE_K + lane * 8;
#pragma unroll
        for (int r = 0; r < TILE; ++r) {
            const unsigned short* src = w + (long)min(n0 + r, n - 1) * k + k0;
            cp_async16(buf_s + (b * TILE + r) * ROW_BYTES + lane * 16, src);
        }
    };

    // Column g of B is x row g; rows past T multiply as zeros.
    const bool live = g < t_len;
    const unsigned short* xr = x + (long)(live ? g : 0) * k + 4 * q;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (kw < stages) issue(kw, 0);
    cp_commit();
    int it = 0;
    for (int s = kw; s < stages; s += KS, ++it) {
        // the next stage goes in flight before this one is multiplied; an empty group at the end
        // keeps "all but the newest group landed" meaning "this stage landed"
        if (s + KS < stages) issue(s + KS, (it + 1) & 1);
        cp_commit();
        cp_wait_one();
        __syncwarp();
        const unsigned char* a_row = buf + ((it & 1) * TILE + g) * ROW_BYTES + 8 * q;
        const unsigned short* xs = xr + (long)s * STAGE_K;
#pragma unroll
        for (int m = 0; m < STAGE_K / 16; ++m) {
            const uint2 a = *(const uint2*)(a_row + 32 * m);
            const uint2 b = *(const uint2*)(a_row + 8 * ROW_BYTES + 32 * m);
            uint2 xv = __ldg((const uint2*)(xs + 16 * m));
            if (!live) xv = make_uint2(0u, 0u);
            mma(c, a.x, b.x, a.y, b.y, xv.x, xv.y);
        }
        __syncwarp();  // every lane is done with this buffer before it is refilled
    }
    if (KS > 1) {
#pragma unroll
        for (int i = 0; i < 4; ++i) part[warp][i][lane] = c[i];
        __syncthreads();
        if (kw != 0) return;
        for (int o = 1; o < KS; ++o)
#pragma unroll
            for (int i = 0; i < 4; ++i) c[i] += part[warp + o][i][lane];
    }
    // c0, c1: row g, columns 2q, 2q+1; c2, c3: row g+8, the same columns. Column = x row.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = n0 + g + (i >> 1) * 8, t = 2 * q + (i & 1);
        if (t < t_len && row < n) y[(long)t * n + row] = to_bf16(c[i]);
    }
}

#define GEMV(KK)                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) unmask_gemv_ks##KK(                                  \
        const unsigned short* w, const unsigned short* x, unsigned short* y, int t_len, int n, int k) {    \
        gemv<KK>(w, x, y, t_len, n, k);                                                                    \
    }

GEMV(1)
GEMV(2)
GEMV(4)
GEMV(8)
