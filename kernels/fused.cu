// Fused pieces of the Qwen3 layer for the GPU path (src/model/ops.rs launches them; the same
// functions on the CPU, and on the GPU with UNMASK_FUSED=0, are chains of candle ops, which are
// the reference these kernels are checked against by `unmask check-device`).
//
//   qkv_prep:  [T, (H + 2 KV) * d] output of the stacked q/k/v projection -> [H + 2 KV, T, d]:
//              q and k heads get their RMSNorm and RoPE, v heads are copied. The k|v part is
//              then exactly the [2, KV, T, d] block the cache scatter takes.
//              Replaces 3 transposing copies, 2 RMSNorms, 2 RoPEs and a concatenation.
//   attention: one query row of one head per block, over cache slots [0, keys) with an optional
//              additive [T, keys] mask, GQA by index: scores, softmax and the weighted sum of V
//              in f32, written as [T, H * d]. Replaces 2 batched matmuls, a scale, a mask add, a
//              softmax and a transposing copy.
//   silu_mul:  [T, 2 I] (gate | up) -> [T, I] silu(gate) * up.
//   add_rms_norm: x [T, h] + delta [T, h] -> [2, T, h]: the sum (the new residual stream, rounded
//              to the storage dtype) and its RMSNorm with weight w. Replaces an add and an RMSNorm.
// No kernel takes a position or a length that changes from block to block as an argument (the
// RoPE rows and the mask are device tensors), so a captured CUDA graph replays them for any block. Math in f32; bf16 is read and written as raw bits (no headers, for
// NVRTC).

#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float ld(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float ld(const unsigned short* p, long i) { return __uint_as_float(((unsigned)p[i]) << 16); }
__device__ __forceinline__ void st(float* p, long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(unsigned short* p, long i, float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) { p[i] = 0x7fc0; return; }  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    p[i] = (unsigned short)(u >> 16);
}

// Sum over the block; every thread gets the result. `red` holds >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = 0.0f;
    for (int w = 0; w < nw; ++w) r += red[w];
    return r;
}

__device__ __forceinline__ float block_max(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = NEG_INF;
    for (int w = 0; w < nw; ++w) r = fmaxf(r, red[w]);
    return r;
}

// grid (H + 2 KV, T), block 128 (any multiple of 32), dynamic smem d floats.
template <typename T>
__device__ void qkv_prep(const T* __restrict__ qkv, const T* __restrict__ q_norm, const T* __restrict__ k_norm,
                         const T* __restrict__ cos, const T* __restrict__ sin, T* __restrict__ out,
                         int t_len, int heads, int kvh, int d, float eps) {
    extern __shared__ float sm[];
    float* x = sm;
    __shared__ float red[32];
    const int hh = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int nh = heads + 2 * kvh;
    const T* row = qkv + ((long)t * nh + hh) * d;
    T* dst = out + ((long)hh * t_len + t) * d;
    if (hh >= heads + kvh) {  // v: copied
        for (int i = tid; i < d; i += nt) dst[i] = row[i];
        return;
    }
    float ss = 0.0f;
    for (int i = tid; i < d; i += nt) {
        float v = ld(row, i);
        x[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)d + eps);
    const T* w = hh < heads ? q_norm : k_norm;
    __syncthreads();
    for (int i = tid; i < d; i += nt) x[i] = x[i] * r * ld(w, i);
    __syncthreads();
    const int half = d / 2;
    for (int i = tid; i < half; i += nt) {
        float c = ld(cos, (long)t * half + i), s = ld(sin, (long)t * half + i);
        float a = x[i], b = x[i + half];
        st(dst, i, a * c - b * s);
        st(dst, i + half, a * s + b * c);
    }
}

// grid (H, T), block 128, dynamic smem (d + keys) floats.
template <typename T>
__device__ void attention(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                          const T* __restrict__ mask, T* __restrict__ out, int t_len, int heads, int kvh, int d,
                          int cap, int keys, float scale) {
    extern __shared__ float sm[];
    float* qf = sm;
    float* sc = sm + d;
    __shared__ float red[32];
    const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const int g = h / (heads / kvh);
    const T* qr = q + ((long)h * t_len + t) * d;
    const T* kb = k_cache + (long)g * cap * d;
    const T* vb = v_cache + (long)g * cap * d;
    for (int i = tid; i < d; i += nt) qf[i] = ld(qr, i);
    __syncthreads();
    for (int j = warp; j < keys; j += nw) {
        const T* kr = kb + (long)j * d;
        float dot = 0.0f;
        for (int i = lane; i < d; i += 32) dot += qf[i] * ld(kr, i);
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (lane == 0) sc[j] = dot * scale + (mask ? ld(mask, (long)t * keys + j) : 0.0f);
    }
    __syncthreads();
    float m = NEG_INF;
    for (int j = tid; j < keys; j += nt) m = fmaxf(m, sc[j]);
    m = block_max(m, red);
    float s = 0.0f;
    for (int j = tid; j < keys; j += nt) {
        float e = sc[j] == NEG_INF ? 0.0f : expf(sc[j] - m);
        sc[j] = e;
        s += e;
    }
    s = block_sum(s, red);
    __syncthreads();
    const float inv = 1.0f / s;
    T* o = out + (long)t * heads * d + (long)h * d;
    for (int i = tid; i < d; i += nt) {
        float acc = 0.0f;
        for (int j = 0; j < keys; ++j) acc += sc[j] * ld(vb, (long)j * d + i);
        st(o, i, acc * inv);
    }
}

// grid ceil(T * I / 256), block 256
template <typename T>
__device__ void silu_mul(const T* __restrict__ gu, T* __restrict__ out, int t_len, int inter) {
    long n = (long)t_len * inter;
    for (long k = (long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (long)gridDim.x * blockDim.x) {
        long t = k / inter, i = k % inter;
        float g = ld(gu, t * 2 * inter + i), u = ld(gu, t * 2 * inter + inter + i);
        st(out, k, g / (1.0f + expf(-g)) * u);
    }
}

// grid T, block 256, dynamic smem h floats.
template <typename T>
__device__ void add_rms_norm(const T* __restrict__ x, const T* __restrict__ delta, const T* __restrict__ w,
                             T* __restrict__ out, int t_len, int h, float eps) {
    extern __shared__ float sm[];
    __shared__ float red[32];
    const int t = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const long base = (long)t * h;
    T* sum_out = out + base;
    T* norm_out = out + (long)t_len * h + base;
    float ss = 0.0f;
    for (int i = tid; i < h; i += nt) {
        st(sum_out, i, ld(x, base + i) + ld(delta, base + i));
        float v = ld(sum_out, i);  // the stored (rounded) value, as the unfused add + norm see it
        sm[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)h + eps);
    for (int i = tid; i < h; i += nt) st(norm_out, i, sm[i] * r * ld(w, i));
}

#define QKV(NAME, T)                                                                                        \
    extern "C" __global__ void NAME(const T* qkv, const T* qn, const T* kn, const T* cos, const T* sin,    \
                                    T* out, int t_len, int heads, int kvh, int d, float eps) {             \
        qkv_prep<T>(qkv, qn, kn, cos, sin, out, t_len, heads, kvh, d, eps);                                \
    }
#define ATT(NAME, T)                                                                                        \
    extern "C" __global__ void NAME(const T* q, const T* k, const T* v, const T* mask, T* out, int t_len,  \
                                    int heads, int kvh, int d, int cap, int keys, float scale) {           \
        attention<T>(q, k, v, mask, out, t_len, heads, kvh, d, cap, keys, scale);                          \
    }
#define SILU(NAME, T)                                                                                       \
    extern "C" __global__ void NAME(const T* gu, T* out, int t_len, int inter) { silu_mul<T>(gu, out, t_len, inter); }

#define ADDNORM(NAME, T)                                                                                    \
    extern "C" __global__ void NAME(const T* x, const T* delta, const T* w, T* out, int t_len, int h, float eps) { \
        add_rms_norm<T>(x, delta, w, out, t_len, h, eps);                                                   \
    }

ADDNORM(unmask_add_rms_norm_f32, float)
ADDNORM(unmask_add_rms_norm_bf16, unsigned short)
QKV(unmask_qkv_prep_f32, float)
QKV(unmask_qkv_prep_bf16, unsigned short)
ATT(unmask_attention_f32, float)
ATT(unmask_attention_bf16, unsigned short)
SILU(unmask_silu_mul_f32, float)
SILU(unmask_silu_mul_bf16, unsigned short)
