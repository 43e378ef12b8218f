// y [T, N] = x [T, K] . W^T for the few rows of a block pass (T <= 8), W stored [N, K] (the
// checkpoint's own [out, in] layout), everything bf16, sums in f32, on the tensor cores.
//
// A block pass multiplies 4 or 8 rows, so it is bound by streaming W once from HBM. Done with
// FMAs, the widening of every weight and the T FMAs per weight leave the loop issue-bound at
// T = 8 (measured: 1.7 TB/s on the gate|up projection against 3 TB/s at T = 1). Here one
// mma.sync m16n8k16 multiplies a 16 x 16 tile of W by a 16 x 8 tile of x (T padded to 8), so
// the instruction count per weight byte is tiny and the same for any T <= 8.
//
// The dot product is a sum over k, so any permutation of k that A (W) and B (x) share gives
// the same result. The fragment layout gives lane (g = lane / 4, q = lane % 4) the k slots
// {2q, 2q+1, 2q+8, 2q+9} of rows g and g+8 of A and of column g of B; we feed those slots
// from 8 consecutive k values k0 + 8q .. k0 + 8q + 7 of each row, loaded with one 16-byte load,
// so a warp covers 32 k per step with two mma (the first takes values 0..3, the second 4..7).
// W is read with loads that skip L1 (each weight is used once), x through L1 (every warp reads
// it).
//
// Launch (src/model/gemv.rs picks KS so that the grid fills the card):
//   block 256 threads = 8 warps; warps in groups of KS split the K steps between them; each
//   group owns a tile of 16 consecutive output rows, so a block covers 16 * 8 / KS rows; grid
//   ceil(N / that). K % 32 == 0 and x, W 16-byte aligned (the launcher checks; otherwise
//   cuBLAS runs instead). Rows past N read row N-1 again (in bounds) and are never written.
// Math: products of bf16 values are exact in f32; sums in f32 in another order than
// src/model/gemv.rs's CPU body, so results agree before the final rounding to bf16.

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

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
__device__ void gemv(const uint4* __restrict__ w, const uint4* __restrict__ x, unsigned short* __restrict__ y,
                     int t_len, int n, int k8) {
    __shared__ float part[8][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = warp / KS, kw = warp % KS;
    const int g = lane >> 2, q = lane & 3;
    const int n0 = (blockIdx.x * (8 / KS) + group) * 16;
    const uint4* w0 = w + (long)min(n0 + g, n - 1) * k8 + q;
    const uint4* w8 = w + (long)min(n0 + g + 8, n - 1) * k8 + q;
    // Column g of B is x row g; rows past T multiply as zeros.
    const bool live = g < t_len;
    const uint4* xr = x + (long)(live ? g : 0) * k8 + q;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int steps = k8 / 4;  // 32 k per step
#pragma unroll 4
    for (int s = kw; s < steps; s += KS) {
        const uint4 a = ld_stream(w0 + 4 * s), b = ld_stream(w8 + 4 * s);
        uint4 xv = __ldg(xr + 4 * s);
        if (!live) xv = make_uint4(0u, 0u, 0u, 0u);
        mma(c, a.x, b.x, a.y, b.y, xv.x, xv.y);
        mma(c, a.z, b.z, a.w, b.w, xv.z, xv.w);
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
        const uint4* w, const uint4* x, unsigned short* y, int t_len, int n, int k8) {                     \
        gemv<KK>(w, x, y, t_len, n, k8);                                                                   \
    }

GEMV(1)
GEMV(2)
GEMV(4)
GEMV(8)
