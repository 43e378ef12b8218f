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
//   attention_staged: the same for the streamed layer (bf16, d = 128, up to 512 keys), with
//              the cache's K rows copied into shared memory before its PDL wait; its PREP form
//              (attention_prep) does q/k prep itself, from the q|k|v product.
//   attention_split + attention_merge: the streamed layer's attention past 512 keys
//              (flash-decoding: 128-key chunks of a KV head on the tensor cores, then a merge).
//   silu_mul:  [T, 2 I] (gate | up) -> [T, I] silu(gate) * up.
//   add_rms_norm: x [T, h] + delta [T, h] -> [2, T, h]: the sum (the new residual stream, rounded
//              to the storage dtype) and its RMSNorm with weight w. Replaces an add and an RMSNorm.
// No kernel takes a position or a length that changes from block to block as an argument (the
// RoPE rows and the mask are device tensors), so a captured CUDA graph replays them for any block. Math in f32; bf16 is read and written as raw bits (no headers, for
// NVRTC).

#include "common.cuh"  // dependency_wait, launch_dependents, to_bf16, cp_async16, smem_addr, mma_bf16_16816

#define NEG_INF (__int_as_float(0xff800000))

// Programmatic dependent launch (src/model/cuda/launch.rs; UNMASK_PDL=0 turns it off): every
// kernel here first waits until the kernel before it has finished and its writes are visible,
// then lets the next kernel in the stream launch, so a kernel's launch overlaps the one before
// it, one kernel deep, and nothing is read early. Launched the ordinary way the wait returns at
// once. On the standard layer, cuBLAS between these kernels, neither order of the two nor
// launching this way at all changed a forward measurably; on the streamed layer PDL is worth
// about 12 % (docs/tuning.md). Both compile away before sm_90.
__device__ __forceinline__ void pdl_enter() {
    dependency_wait();
    launch_dependents();
}

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

// grid (H + 2 KV, T), block 128 (any multiple of 32), dynamic smem 3 d floats. Every load
// (the row, its norm weight, the RoPE row) is issued before the reduction, unconditionally
// (clamped in bounds), so the kernel waits on memory once. RoPE turns the first `rot` (even,
// at most d) dimensions, rotate-half within them; the rest leave normed (a partial rotary
// embedding: LLaDA2's half head).
template <typename T>
__device__ void qkv_prep(const T* __restrict__ qkv, const T* __restrict__ q_norm, const T* __restrict__ k_norm,
                         const T* __restrict__ cos, const T* __restrict__ sin, T* __restrict__ out,
                         int t_len, int heads, int kvh, int d, int rot, float eps) {
    extern __shared__ float sm[];
    const int half = rot / 2;
    float* x = sm;
    float* wn = sm + d;
    float* cs = sm + 2 * d;
    float* sn = cs + half;
    __shared__ float red[32];
    const int hh = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int nh = heads + 2 * kvh;
    const T* row = qkv + ((long)t * nh + hh) * d;
    T* dst = out + ((long)hh * t_len + t) * d;
    if (hh >= heads + kvh) {  // v: copied
        for (int i = tid; i < d; i += nt) dst[i] = row[i];
        return;
    }
    const T* w = hh < heads ? q_norm : k_norm;
    float ss = 0.0f;
    for (int i = tid; i < d; i += nt) {
        const int ih = min(i, half - 1);
        const float v = ld(row, i), wi = ld(w, i);
        const float c = ld(cos, (long)t * half + ih), s = ld(sin, (long)t * half + ih);
        x[i] = v;
        wn[i] = wi;
        if (i < half) { cs[i] = c; sn[i] = s; }
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)d + eps);
    __syncthreads();
    for (int i = tid; i < d; i += nt) x[i] = x[i] * r * wn[i];
    __syncthreads();
    for (int i = tid; i < half; i += nt) {
        float a = x[i], b = x[i + half];
        st(dst, i, a * cs[i] - b * sn[i]);
        st(dst, i + half, a * sn[i] + b * cs[i]);
    }
    for (int i = rot + tid; i < d; i += nt) st(dst, i, x[i]);
}

// Packed bf16 values widened to f32: 4 from a uint2, 8 from a uint4.
__device__ __forceinline__ void unpack4(uint2 v, float* f) {
    f[0] = __uint_as_float(v.x << 16); f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16); f[3] = __uint_as_float(v.y & 0xffff0000u);
}
__device__ __forceinline__ void unpack8(uint4 v, float* f) {
    unpack4(make_uint2(v.x, v.y), f);
    unpack4(make_uint2(v.z, v.w), f + 4);
}

// 8 consecutive values as f32 (one 16-byte load of bf16; two float4 loads of f32).
__device__ __forceinline__ void ld8(const float* p, float* f) {
    float4 a = __ldg((const float4*)p), b = __ldg((const float4*)p + 1);
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}
__device__ __forceinline__ void ld8(const unsigned short* p, float* f) { unpack8(__ldg((const uint4*)p), f); }

// grid (H, T), block 512 (16 warps), dynamic smem (d + keys + 16 d) floats (q, the scores, the
// warps' partial sums); d % 8 == 0, d <= 256.
// 512 threads so a cache of up to 512 keys is scored in one round of loads and the V sum of a
// few hundred live keys takes one or two (256 took twice as many round trips).
// Latency, not bandwidth, bounds this kernel (a few hundred keys of one head), so every loop
// keeps many independent loads in flight: a thread per key for the scores (16-byte loads
// along d, all in flight at once), and for V each half-warp takes a key with its lanes across
// d (16-byte loads; several keys in flight), the partial sums added across the half-warps by
// a shuffle and across the eight warps through shared memory. V rows past the last visible key
// are never read.
// D: the head size when known at compile time (128, every Qwen3), so the loops over it unroll
// completely; 0 for any other.
template <typename T, int D>
__device__ void attention(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                          const T* __restrict__ mask, T* __restrict__ out, int t_len, int heads, int kvh, int d_arg,
                          int cap, int keys, float scale) {
    const int d = D ? D : d_arg;
    extern __shared__ float sm[];
    float* qf = sm;
    float* sc = sm + d;
    float* part = sm + d + keys;  // [16][d]
    __shared__ float red[32];
    const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const int g = h / (heads / kvh);
    const T* qr = q + ((long)h * t_len + t) * d;
    const T* kb = k_cache + (long)g * cap * d;
    const T* vb = v_cache + (long)g * cap * d;
    for (int i = tid; i < d; i += nt) qf[i] = ld(qr, i);
    __syncthreads();
    float m = NEG_INF, last = 0.0f;  // the score max, and 1 + the last key with a finite score
    for (int j = tid; j < keys; j += nt) {
        // Masked keys are read too (cache slots always hold finite values: zeros or earlier
        // K), so that the mask and all of a key's loads are in flight at once.
        const float mj = mask ? ld(mask, (long)t * keys + j) : 0.0f;
        const T* kr = kb + (long)j * d;
        float dot = 0.0f;
#pragma unroll 16
        for (int i = 0; i < d; i += 8) {
            float kf[8];
            ld8(kr + i, kf);
#pragma unroll
            for (int e = 0; e < 8; ++e) dot = fmaf(qf[i + e], kf[e], dot);
        }
        const float s = mj == NEG_INF ? NEG_INF : dot * scale + mj;
        sc[j] = s;
        if (s != NEG_INF) last = (float)(j + 1);
        m = fmaxf(m, s);
    }
    m = block_max(m, red);
    const int live = (int)block_max(last, red);
    float sum = 0.0f;
    for (int j = tid; j < live; j += nt) {
        const float e = sc[j] == NEG_INF ? 0.0f : expf(sc[j] - m);
        sc[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red);  // its leading __syncthreads also publishes sc
    __syncthreads();
    // V: each half-warp takes one key (16 lanes x 8 values = 128 of d; a second chunk for
    // d <= 256), so a warp reads two keys per step with 16-byte loads.
    float acc[2][8];
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[c][e] = 0.0f;
    const int chunks = d / 8, half = lane >> 4, hl = lane & 15;
#pragma unroll 8
    for (int j = 2 * warp + half; j < live; j += 2 * nw) {
        const float p = sc[j];
        const T* vr = vb + (long)j * d;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int ch = hl + 16 * c;
            if (ch < chunks) {
                float vf[8];
                ld8(vr + 8 * ch, vf);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[c][e] = fmaf(p, vf[e], acc[c][e]);
            }
        }
    }
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[c][e] += __shfl_xor_sync(0xffffffffu, acc[c][e], 16);
    if (half == 0) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int ch = hl + 16 * c;
            if (ch < chunks)
#pragma unroll
                for (int e = 0; e < 8; ++e) part[warp * d + 8 * ch + e] = acc[c][e];
        }
    }
    __syncthreads();
    const float inv = 1.0f / sum;
    T* o = out + (long)t * heads * d + (long)h * d;
    for (int i = tid; i < d; i += nt) {
        float v = 0.0f;
        for (int w = 0; w < nw; ++w) v += part[w * d + i];
        st(o, i, v * inv);
    }
}

// attention_staged: the streamed layer's attention (bf16, d = 128, keys <= 512: a thread a
// key). grid (H, T), block 512, dynamic smem ATT_STAGED_SMEM(keys) bytes.
// The plain kernel above waits on memory three times after the kernel before it has finished
// (q, then K, then V, each a round trip to the L2 or HBM). Here, before griddepcontrol.wait,
// a block copies the K rows [0, keys) of its KV head into shared memory (cp.async, all in
// flight at once) and asks the L2 for the V rows: no kernel of the pass writes the cache
// except at the pass's own slots, so the HBM round trip overlaps q/k prep. After the wait it
// reads q and re-reads the K rows of the pass's slots (`positions`, which q/k prep has just
// written) in one L2 round trip; the scores come from shared memory and V from the L2.
// K rows are ATT_PITCH bf16 apart (16 bytes of padding), so that the eight threads of a
// quarter-warp, reading eight keys at the same offset, hit distinct banks. V is not staged:
// K and V both take twice the shared memory, 184 KiB at 320 keys, more than the split the
// gemvs ask for (132 KiB, src/model/cuda/launch.rs), so the SM's split would change under the
// gemv blocks that follow on it, which measured slower (docs/tuning.md). Same arithmetic
// as the plain kernel: per key the same dot product order, max, exp and sums in f32; V summed
// per half-warp then across warps.
#define ATT_PITCH 136
#define ATT_STAGED_SMEM(keys) ((keys) * ATT_PITCH * 2 + (128 + (keys) + 16 * 128) * 4)

// The uint2 of a RoPE table row (rot / 2 values: rot / 8 uint2) that lane `lane` of a head of
// 128 reads at row t: its own 4 values' cos or sin, the same for partner lanes (in bounds for
// every lane, those past the rotated values included, so the load need not be guarded).
__device__ __forceinline__ long rope_lane(int t, int lane, int rot) {
    const int rq = rot >> 3;
    return (long)t * rq + (lane & (rq - 1));
}

// One q or k head of 128 (a warp, lane l its values 4l .. 4l + 3 in `raw`) through its RMSNorm
// (weight values `wr`) and RoPE over its first `rot` values (the row's cos/sin values `cr`,
// `sr`, as rope_lane picks them; rot / 8 = rq lanes hold half of them, lane l and lane l ^ rq
// partners), rounded to bf16: lane l's 4 values. rot is 8, 16, 32, 64 or 128 (rq a power of
// two); lanes past the rotated values pass theirs through normed (LLaDA2's rot 64: lanes 16-31).
__device__ __forceinline__ uint2 prep_head_d128(uint2 raw, uint2 wr, uint2 cr, uint2 sr, float eps, int rot) {
    const int lane = threadIdx.x & 31;
    float x[4], w[4], c[4], sn[4];
    unpack4(raw, x);
    unpack4(wr, w);
    unpack4(cr, c);
    unpack4(sr, sn);
    float ss = x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = 1.0f / sqrtf(ss / 128.0f + eps);
    const int rq = rot >> 3;
    float o4[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float v = x[i] * r * w[i];
        const float p = __shfl_xor_sync(0xffffffffu, v, rq);  // the partner half
        // first half (lanes below rq): a*c - b*s; second half, as the generic kernel:
        // out[i + rot/2] = a*s + b*c; past the rotated lanes: as normed
        o4[i] = lane >= 2 * rq ? v : lane < rq ? v * c[i] - p * sn[i] : p * sn[i] + v * c[i];
    }
    unsigned short b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) st(b, i, o4[i]);
    return make_uint2(b[0] | ((unsigned)b[1] << 16), b[2] | ((unsigned)b[3] << 16));
}

// PREP (unmask_attention_prep_bf16_d128): the same attention, with q/k prep folded in: q is the
// q|k|v product's output [T, (H + 2 KV) * 128], not yet normed or rotated. After the wait, warp 0
// preps this block's q head (RMSNorm, RoPE, rounded to bf16 as q/k prep rounds it) and warps
// 1 .. T each the k head of KV group g at one pass row, which goes straight into the staged K
// rows (at its slot); the row's v head is kept in shared memory and read in place of the
// cache's row at that slot. The cache's rows of the pass are written by the blocks of the
// group's first q head, each its own row t. So no kernel runs between the q|k|v product and
// attention (q/k prep, its launch and its wait are gone), and the pass's K/V rows reach the
// cache for the passes after this one. T <= 15 (a warp a row, beside warp 0).
template <bool PREP>
__device__ void attention_staged(const unsigned short* __restrict__ q, const uint2* __restrict__ qkv,
                                 const uint2* __restrict__ q_norm, const uint2* __restrict__ k_norm,
                                 const uint2* __restrict__ cos, const uint2* __restrict__ sin,
                                 const uint4* k_cache, const uint4* v_cache, uint2* k_write, uint2* v_write,
                                 const unsigned short* __restrict__ mask, const unsigned* __restrict__ positions,
                                 unsigned short* __restrict__ out, int t_len, int heads, int kvh, int cap, int keys,
                                 int rot, float scale, float eps) {
    extern __shared__ uint4 stage[];
    // PREP: the pass rows' v heads first, [15][32] uint2 (16-byte aligned for their uint4 reads)
    uint2* vfr = (uint2*)stage;
    uint4* ks = stage + (PREP ? 15 * 32 / 2 : 0);     // [keys][ATT_PITCH / 8]
    float* qf = (float*)(ks + keys * (ATT_PITCH / 8));  // [128]
    float* sc = qf + 128;                              // [keys]
    float* part = sc + keys;                           // [16][128]
    short* fidx = (short*)(part + 16 * 128);           // PREP: [keys], the pass row at a slot, or -1
    __shared__ float red[32];
    const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = h / (heads / kvh);
    const uint4* kb = k_cache + (long)g * cap * 16;
    const uint4* vb = v_cache + (long)g * cap * 16;
    // Before the wait: the cache, this key's mask value and the pass's slots (the host wrote
    // the last two before the pass; no kernel writes them).
    for (int i = tid; i < keys * 16; i += 512) cp_async16(ks + (i >> 4) * (ATT_PITCH / 8) + (i & 15), kb + i);
    for (int i = tid; i < keys * 2; i += 512) asm volatile("prefetch.global.L2 [%0];" ::"l"(vb + 8 * i) : "memory");
    const float mj = (mask && tid < keys) ? __uint_as_float(((unsigned)mask[(long)t * keys + tid]) << 16) : 0.0f;
    // the K row of slot positions[w] is re-read by the first half of warp w (PREP: computed)
    const int slot = (!PREP && tid < 32 * t_len && lane < 16) ? (int)positions[warp] : keys;
    pdl_enter();
    if (PREP) {
        if (tid < keys) fidx[tid] = -1;
        const int nh = heads + 2 * kvh, my = warp - 1;
        uint2 kf = make_uint2(0u, 0u), vf = kf;
        if (warp == 0) {
            const uint2 o = prep_head_d128(qkv[((long)t * nh + h) * 32 + lane], q_norm[lane],
                                           cos[rope_lane(t, lane, rot)], sin[rope_lane(t, lane, rot)], eps, rot);
            float f[4];
            unpack4(o, f);
#pragma unroll
            for (int e = 0; e < 4; ++e) qf[4 * lane + e] = f[e];
        } else if (my < t_len) {
            kf = prep_head_d128(qkv[((long)my * nh + heads + g) * 32 + lane], k_norm[lane],
                                cos[rope_lane(my, lane, rot)], sin[rope_lane(my, lane, rot)], eps, rot);
            vf = qkv[((long)my * nh + heads + kvh + g) * 32 + lane];
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();  // every copy landed (and fidx is -1) before the pass's rows overwrite theirs
        if (warp > 0 && my < t_len) {
            const int pos = (int)positions[my];
            if (pos < keys) {
                ((uint2*)(ks + pos * (ATT_PITCH / 8)))[lane] = kf;
                if (lane == 0) fidx[pos] = (short)my;
            }
            vfr[my * 32 + lane] = vf;
            if (h == g * (heads / kvh) && t == my) {
                k_write[((long)g * cap + pos) * 32 + lane] = kf;
                v_write[((long)g * cap + pos) * 32 + lane] = vf;
            }
        }
    } else {
        if (tid < 16) {
            float f[8];
            unpack8(((const uint4*)(q + ((long)h * t_len + t) * 128))[tid], f);
#pragma unroll
            for (int e = 0; e < 8; ++e) qf[8 * tid + e] = f[e];
        }
        const bool refresh = slot < keys;
        uint4 fresh = make_uint4(0u, 0u, 0u, 0u);
        if (refresh) fresh = kb[(long)slot * 16 + lane];
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();  // every copy landed before the fresh rows overwrite theirs
        if (refresh) ks[slot * (ATT_PITCH / 8) + lane] = fresh;
    }
    __syncthreads();
    float s = NEG_INF;
    if (tid < keys && mj != NEG_INF) {
        const uint4* kr = ks + tid * (ATT_PITCH / 8);
        float dot = 0.0f;
#pragma unroll
        for (int c = 0; c < 16; ++c) {
            float kf[8];
            unpack8(kr[c], kf);
#pragma unroll
            for (int e = 0; e < 8; ++e) dot = fmaf(qf[8 * c + e], kf[e], dot);
        }
        s = dot * scale + mj;
    }
    const float m = block_max(s, red);
    const int live = (int)block_max(s != NEG_INF ? (float)(tid + 1) : 0.0f, red);
    const float e = (tid < live && s != NEG_INF) ? expf(s - m) : 0.0f;
    if (tid < keys) sc[tid] = e;
    const float sum = block_sum(e, red);  // its leading __syncthreads also publishes sc
    __syncthreads();
    // V: each half-warp takes a key (16 lanes x 8 values), keys 2 w + half, + 32, ...
    const int half = lane >> 4, hl = lane & 15;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
#pragma unroll 4
    for (int j = 2 * warp + half; j < live; j += 32) {
        const float p = sc[j];
        float vf[8];
        const int fi = PREP ? fidx[j] : -1;  // PREP: a pass row's v head, from shared memory
        unpack8(fi < 0 ? __ldg(vb + (long)j * 16 + hl) : ((const uint4*)(vfr + fi * 32))[hl], vf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(p, vf[i], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 16);
    if (half == 0)
#pragma unroll
        for (int i = 0; i < 8; ++i) part[warp * 128 + 8 * hl + i] = acc[i];
    __syncthreads();
    const float inv = 1.0f / sum;
    if (tid < 128) {
        float v = 0.0f;
        for (int w = 0; w < 16; ++w) v += part[w * 128 + tid];
        st(out + (long)t * heads * 128 + (long)h * 128, tid, v * inv);
    }
}

extern "C" __global__ void __launch_bounds__(512) unmask_attention_staged_bf16_d128(
    const unsigned short* __restrict__ q, const uint4* __restrict__ k_cache, const uint4* __restrict__ v_cache,
    const unsigned short* __restrict__ mask, const unsigned* __restrict__ positions, unsigned short* __restrict__ out,
    int t_len, int heads, int kvh, int cap, int keys, float scale) {
    attention_staged<false>(q, nullptr, nullptr, nullptr, nullptr, nullptr, k_cache, v_cache, nullptr, nullptr, mask,
                            positions, out, t_len, heads, kvh, cap, keys, 128, scale, 0.0f);
}

// grid (H, T), block 512, dynamic smem ATT_PREP_SMEM(keys) bytes; T <= 15. k_cache and v_cache:
// the halves of the cache [2, KV, cap, 128], written at the pass's slots; RoPE over the first rot
// values of a head (prep_head_d128).
#define ATT_PREP_SMEM(keys) (ATT_STAGED_SMEM(keys) + 15 * 32 * 8 + (keys) * 2)
extern "C" __global__ void __launch_bounds__(512) unmask_attention_prep_bf16_d128(
    const uint2* __restrict__ qkv, const uint2* __restrict__ q_norm, const uint2* __restrict__ k_norm,
    const uint2* __restrict__ cos, const uint2* __restrict__ sin, uint4* k_cache, uint4* v_cache,
    const unsigned short* __restrict__ mask, const unsigned* __restrict__ positions, unsigned short* __restrict__ out,
    int t_len, int heads, int kvh, int cap, int keys, int rot, float scale, float eps) {
    attention_staged<true>(nullptr, qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, (uint2*)k_cache, (uint2*)v_cache,
                           mask, positions, out, t_len, heads, kvh, cap, keys, rot, scale, eps);
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

// `v` as the storage dtype holds it (rounded to bf16 for bf16), back in f32.
__device__ __forceinline__ float rounded(const float*, float v) { return v; }
__device__ __forceinline__ float rounded(const unsigned short*, float v) {
    unsigned short b;
    st(&b, 0, v);
    return __uint_as_float(((unsigned)b) << 16);
}

// grid T, block 256 (h <= 4096) or 1024 (h <= 16384), no dynamic smem. Latency-bound (a few
// KB per row), so everything a thread needs is loaded up front, into registers: its sums and
// weights, before the one block reduction; nothing is read back from global memory.
#define NORM_PER_THREAD 16
template <typename T>
__device__ void add_rms_norm(const T* __restrict__ x, const T* __restrict__ delta, const T* __restrict__ w,
                             T* __restrict__ out, int t_len, int h, float eps) {
    __shared__ float red[32];
    const int t = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const long base = (long)t * h;
    T* sum_out = out + base;
    T* norm_out = out + (long)t_len * h + base;
    float v[NORM_PER_THREAD], wv[NORM_PER_THREAD];
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < NORM_PER_THREAD; ++c) {
        // Loads are unconditional (clamped in bounds) and masked after: a load under a branch
        // would wait for the one before it.
        const int i = tid + c * nt, ic = min(i, h - 1);
        const float sum = rounded(sum_out, ld(x, base + ic) + ld(delta, base + ic));  // as stored
        v[c] = i < h ? sum : 0.0f;
        wv[c] = ld(w, ic);
        ss += v[c] * v[c];
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)h + eps);
#pragma unroll
    for (int c = 0; c < NORM_PER_THREAD; ++c) {
        const int i = tid + c * nt;
        if (i < h) {
            st(sum_out, i, v[c]);
            st(norm_out, i, v[c] * r * wv[c]);
        }
    }
}

// grid (2 KV, T), block min(d, 1024): cache [2 KV][cap][d] row positions[t] = kv [2 KV][T][d] row t.
template <typename T>
__device__ void kv_write(T* __restrict__ cache, const T* __restrict__ kv, const unsigned* __restrict__ positions,
                         int t_len, int d, int cap) {
    const int r = blockIdx.x, t = blockIdx.y;
    const long p = positions[t];
    const T* src = kv + ((long)r * t_len + t) * d;
    T* dst = cache + ((long)r * cap + p) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
}

#define KVW(NAME, T)                                                                                        \
    extern "C" __global__ void NAME(T* cache, const T* kv, const unsigned* pos, int t_len, int d, int cap) { \
        pdl_enter();                                                                                       \
        kv_write<T>(cache, kv, pos, t_len, d, cap);                                                         \
    }
KVW(unmask_kv_write_f32, float)
KVW(unmask_kv_write_bf16, unsigned short)

// add_rms_norm for bf16 rows with h % 256 == 0 and h <= 8192: block h / 8 threads (whole
// warps, for block_sum's shuffles), each owns 8
// consecutive values, moved with one 16-byte load per input and one store per output.
__device__ __forceinline__ uint4 pack8(const float* f) {
    unsigned short b[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) st(b, i, f[i]);
    return make_uint4(b[0] | ((unsigned)b[1] << 16), b[2] | ((unsigned)b[3] << 16), b[4] | ((unsigned)b[5] << 16),
                      b[6] | ((unsigned)b[7] << 16));
}
extern "C" __global__ void unmask_add_rms_norm_bf16_v8(const uint4* x, const uint4* delta, const uint4* w, uint4* out,
                                                       int t_len, int h, float eps) {
    pdl_enter();
    __shared__ float red[32];
    const int t = blockIdx.x, tid = threadIdx.x, h8 = h / 8;
    const long base = (long)t * h8 + tid;
    float a[8], b[8], wv[8], v[8];
    unpack8(x[base], a);
    unpack8(delta[base], b);
    unpack8(w[tid], wv);
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[i] = rounded((const unsigned short*)0, a[i] + b[i]);  // the stored sum, as unfused
        ss += v[i] * v[i];
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)h + eps);
    float nv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) nv[i] = v[i] * r * wv[i];
    out[base] = pack8(v);
    out[(long)t_len * h8 + base] = pack8(nv);
}

// qkv_prep for bf16 with d = 128: one warp per head (block 4 warps = 4 heads, grid
// (ceil((H + 2 KV) / 4), T)), lane l owning values 4l .. 4l+3 (one 8-byte load each of the row,
// the norm weight and its cos/sin: prep_head_d128's lanes), so the norm is a warp reduction and
// nothing waits on a block barrier.
// CACHE: the k and v heads go straight to their slots of the cache [2 KV][cap][128] (row
// positions[t]) and only the q heads to out [H][T][128], so no kv_write kernel follows.
template <bool CACHE>
__device__ void qkv_prep_d128(const uint2* qkv, const uint2* q_norm, const uint2* k_norm, const uint2* cos,
                              const uint2* sin, uint2* out, uint2* cache, const unsigned* positions, int t_len,
                              int heads, int kvh, int cap, int rot, float eps) {
    const int lane = threadIdx.x & 31, hh = blockIdx.x * 4 + (threadIdx.x >> 5), t = blockIdx.y;
    const int nh = heads + 2 * kvh;
    if (hh >= nh) return;
    const uint2 raw = qkv[((long)t * nh + hh) * 32 + lane];
    uint2* dst = (CACHE && hh >= heads) ? cache + ((long)(hh - heads) * cap + positions[t]) * 32
                                        : out + ((long)hh * t_len + t) * 32;
    if (hh >= heads + kvh) {  // v: copied
        dst[lane] = raw;
        return;
    }
    dst[lane] = prep_head_d128(raw, (hh < heads ? q_norm : k_norm)[lane], cos[rope_lane(t, lane, rot)],
                               sin[rope_lane(t, lane, rot)], eps, rot);
}

extern "C" __global__ void unmask_qkv_prep_bf16_d128(const uint2* qkv, const uint2* q_norm, const uint2* k_norm,
                                                     const uint2* cos, const uint2* sin, uint2* out, int t_len,
                                                     int heads, int kvh, int rot, float eps) {
    pdl_enter();
    qkv_prep_d128<false>(qkv, q_norm, k_norm, cos, sin, out, 0, 0, t_len, heads, kvh, 0, rot, eps);
}

extern "C" __global__ void unmask_qkv_prep_kv_bf16_d128(const uint2* qkv, const uint2* q_norm, const uint2* k_norm,
                                                        const uint2* cos, const uint2* sin, uint2* q_out, uint2* cache,
                                                        const unsigned* positions, int t_len, int heads, int kvh,
                                                        int cap, int rot, float eps) {
    pdl_enter();
    qkv_prep_d128<true>(qkv, q_norm, k_norm, cos, sin, q_out, cache, positions, t_len, heads, kvh, cap, rot, eps);
}

#define QKV(NAME, T)                                                                                        \
    extern "C" __global__ void NAME(const T* qkv, const T* qn, const T* kn, const T* cos, const T* sin,    \
                                    T* out, int t_len, int heads, int kvh, int d, int rot, float eps) {    \
        pdl_enter();                                                                                       \
        qkv_prep<T>(qkv, qn, kn, cos, sin, out, t_len, heads, kvh, d, rot, eps);                           \
    }
#define ATT(NAME, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(512) NAME(const T* q, const T* k, const T* v, const T* mask, \
                                    T* out, int t_len, int heads, int kvh, int d, int cap, int keys, float scale) { \
        pdl_enter();                                                                                       \
        if (d == 128) attention<T, 128>(q, k, v, mask, out, t_len, heads, kvh, d, cap, keys, scale);       \
        else attention<T, 0>(q, k, v, mask, out, t_len, heads, kvh, d, cap, keys, scale);                  \
    }
#define SILU(NAME, T)                                                                                       \
    extern "C" __global__ void NAME(const T* gu, T* out, int t_len, int inter) {                           \
        pdl_enter();                                                                                       \
        silu_mul<T>(gu, out, t_len, inter);                                                                \
    }

#define ADDNORM(NAME, T)                                                                                    \
    extern "C" __global__ void NAME(const T* x, const T* delta, const T* w, T* out, int t_len, int h, float eps) { \
        pdl_enter();                                                                                       \
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

// attention_split (flash-decoding): the streamed layer's attention over long caches (bf16,
// d = 128, any number of keys). The kernels above give a block one query row and have it read
// every key of its KV head, so at 32k keys a block reads 16 MB and the group's 4-32 rows read it
// again each (from the L2 at best), one block per row. Here a block takes one chunk of
// SPLIT_KEYS keys of one KV head for every query row that reads that head (the group's heads
// x T rows, up to SPLIT_ROWS; more rows take more blocks along z): each K and V row is read
// from memory once per block, the grid has KV x chunks blocks, and each block writes, per row,
// its chunk's max score, sum of exponentials and unnormalised V sum (f32). attention_merge
// combines the chunks of a row: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c.
// Rows: r = gi * T + t is head (kv head * group + gi), query t. Same arithmetic per key as the
// kernels above (dot in f32 along d, scaled, plus the mask); sums in another order.
// grid (KV, chunks, ceil(rows / SPLIT_ROWS)), block 256 (8 warps), dynamic smem SPLIT_SMEM(R)
// bytes. part: [KV][chunks][rows][SPLIT_STRIDE] f32: the V sum, max, sum of exponentials, two
// pad floats (rows 16-byte aligned for the merge's float4 loads).
// Both products run on the tensor cores (mma.sync m16n8k16, bf16 in, f32 sums), as the gemv
// does (kernels/gemv.cu): the scores S = K q^T with the chunk's K rows as the A operand (warp w:
// keys 16w .. 16w + 15, each lane's K fragments one 16-byte load a row a 32-wide step, all 8 in
// flight at once) and the q rows as B; then the V sum P V with the exponentials P (bf16, rows
// padded to 16) as A and V as B, V's fragments transposed out of shared memory by ldmatrix (warp
// w: d columns 16w .. 16w + 15). The chunk's V rows are copied into shared memory with cp.async
// first and land while the scores are computed. The first version of this kernel did both
// products on the CUDA cores, a thread a key, and read V from the L2 four keys at a time: at 32k
// keys it was compute- and latency-bound at half this one's speed (docs/tuning.md).
// Exponentials are rounded to bf16 for the tensor cores and their sum taken from the rounded
// values, so numerator and denominator agree.
#define SPLIT_KEYS 128
#define SPLIT_ROWS 32
#define SPLIT_PITCH (SPLIT_KEYS + 1)
#define SPLIT_STRIDE 132
// V and P rows in shared memory, in bf16: 16 bytes of padding a row, so the 8 rows an ldmatrix
// (or 8 lanes) read at one column fall in distinct banks
#define SPLIT_VP 136
#define SPLIT_SMEM(R) (SPLIT_KEYS * SPLIT_VP * 2 + (R) * 128 * 2 + (R) * SPLIT_PITCH * 4 + ((R) + 15) / 16 * 16 * SPLIT_VP * 2 + (R) * 2 * 4)

// Four 8x8 bf16 matrices from shared memory, transposed (lanes 8i .. 8i + 7 give matrix i's rows).
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

template <int R>
__device__ void attention_split(const unsigned short* __restrict__ q, const uint4* __restrict__ k_cache,
                                const unsigned short* __restrict__ v_cache, const unsigned short* __restrict__ mask,
                                float* __restrict__ part, int t_len, int heads, int kvh, int cap, int keys, float scale) {
#if __CUDA_ARCH__ >= 800  // mma.sync on bf16, ldmatrix; the streamed layer needs sm_80 anyway (gemv.cu)
    constexpr int NT = R / 8, MT = (R + 15) / 16;
    extern __shared__ uint4 split_smem[];
    unsigned short* vs = (unsigned short*)split_smem;                  // [SPLIT_KEYS][SPLIT_VP]
    uint4* qs = (uint4*)(vs + SPLIT_KEYS * SPLIT_VP);                  // [R][16]: q rows, bf16
    float(*sc)[SPLIT_PITCH] = (float(*)[SPLIT_PITCH])(qs + R * 16);    // [R][SPLIT_PITCH]
    unsigned short* pb = (unsigned short*)(sc + R);                    // [16 MT][SPLIT_VP]: P, bf16
    float(*stat)[2] = (float(*)[2])(pb + 16 * MT * SPLIT_VP);           // [R][2]
    const int g = blockIdx.x, c = blockIdx.y, chunks = gridDim.y, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, fg = lane >> 2, fq = lane & 3;
    const int group = heads / kvh, rows = group * t_len, r0 = blockIdx.z * R;
    const int k0 = c * SPLIT_KEYS, nk = min(SPLIT_KEYS, keys - k0);
    pdl_enter();
    // the chunk's V rows into shared memory, in flight during the scores
    const uint4* vg = (const uint4*)(v_cache + ((long)g * cap + k0) * 128);
    for (int i = tid; i < nk * 16; i += 256) cp_async16(vs + (i >> 4) * SPLIT_VP + (i & 15) * 8, vg + i);
    // this warp's K fragments: keys 16 warp + fg and + 8 (clamped in bounds), d 32 s + 8 fq ..
    uint4 ka[4], kb[4];
    {
        const int ja = min(16 * warp + fg, nk - 1), jb = min(16 * warp + fg + 8, nk - 1);
        const uint4* kr = k_cache + ((long)g * cap + k0) * 16 + fq;
#pragma unroll
        for (int st = 0; st < 4; ++st) ka[st] = __ldg(kr + ja * 16 + 4 * st), kb[st] = __ldg(kr + jb * 16 + 4 * st);
    }
    // q rows r0 .. r0 + R of this KV head (rows past the last: zeros)
    for (int i = tid; i < R * 16; i += 256) {
        const int rr = i >> 4, ch = i & 15, r = r0 + rr;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < rows) v = ((const uint4*)(q + ((long)(g * group + r / t_len) * t_len + r % t_len) * 128))[ch];
        qs[rr * 16 + ch] = v;
    }
    // P's padding rows (R < 16 a tile) stay zero
    for (int i = R * SPLIT_VP + tid; i < 16 * MT * SPLIT_VP; i += 256) pb[i] = 0;
    __syncthreads();
    // scores: S[key][row] for the warp's 16 keys and every row, 8 rows an mma column block
    {
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
        for (int st = 0; st < 4; ++st)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint4 xv = qs[(8 * nt + fg) * 16 + 4 * st + fq];
                mma_bf16_16816(acc[nt], ka[st].x, kb[st].x, ka[st].y, kb[st].y, xv.x, xv.y);
                mma_bf16_16816(acc[nt], ka[st].z, kb[st].z, ka[st].w, kb[st].w, xv.z, xv.w);
            }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int j = 16 * warp + fg + 8 * (i >> 1), rr = 8 * nt + 2 * fq + (i & 1), r = r0 + rr;
                float s = NEG_INF;
                if (j < nk && r < rows) {
                    const float mj = mask ? __uint_as_float(((unsigned)mask[(long)(r % t_len) * keys + k0 + j]) << 16) : 0.0f;
                    s = mj == NEG_INF ? NEG_INF : acc[nt][i] * scale + mj;
                }
                sc[rr][j] = s;
            }
    }
    __syncthreads();
    // per row: the chunk's max and sum of exponentials; P = the exponentials, bf16
    for (int rr = warp; rr < R; rr += 8) {
        float m = NEG_INF;
        for (int j = lane; j < SPLIT_KEYS; j += 32) m = fmaxf(m, sc[rr][j]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float l = 0.0f;
        for (int j = lane; j < SPLIT_KEYS; j += 32) {
            const unsigned short e = sc[rr][j] == NEG_INF ? (unsigned short)0 : to_bf16(expf(sc[rr][j] - m));
            pb[rr * SPLIT_VP + j] = e;
            l += __uint_as_float(((unsigned)e) << 16);
        }
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) stat[rr][0] = m, stat[rr][1] = l;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    // V rows past the chunk's keys: zeros (their P is 0, but 0 x NaN of a stale row is NaN)
    for (int i = nk * 16 + tid; i < SPLIT_KEYS * 16; i += 256) *(uint4*)(vs + (i >> 4) * SPLIT_VP + (i & 15) * 8) = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
    // V sum: rows (16 a tile) x the warp's d columns 16 warp .. + 16 (two n tiles), over 8 k steps
    // of 16 keys; B from V [key][d] by ldmatrix.trans: matrices (keys +0, d +0), (keys +8, d +0),
    // (keys +0, d +8), (keys +8, d +8)
    {
        float acc[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < 2; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
        const int lrow = (lane & 7) + ((lane >> 3) & 1) * 8, lcol = 16 * warp + (lane >> 4) * 8;
#pragma unroll
        for (int ks = 0; ks < SPLIT_KEYS / 16; ++ks) {
            unsigned b[4];
            ldmatrix_x4_trans(b, vs + (16 * ks + lrow) * SPLIT_VP + lcol);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const unsigned short* pr = pb + (16 * mt + fg) * SPLIT_VP + 16 * ks + 2 * fq;
                const unsigned a0 = *(const unsigned*)pr, a1 = *(const unsigned*)(pr + 8 * SPLIT_VP);
                const unsigned a2 = *(const unsigned*)(pr + 8), a3 = *(const unsigned*)(pr + 8 * SPLIT_VP + 8);
                mma_bf16_16816(acc[mt][0], a0, a1, a2, a3, b[0], b[1]);
                mma_bf16_16816(acc[mt][1], a0, a1, a2, a3, b[2], b[3]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int rr = 16 * mt + fg + 8 * h2, r = r0 + rr;
                if (rr >= R || r >= rows) continue;
                float* o = part + (((long)g * chunks + c) * rows + r) * SPLIT_STRIDE;
#pragma unroll
                for (int n = 0; n < 2; ++n)
                    *(float2*)(o + 16 * warp + 8 * n + 2 * fq) = make_float2(acc[mt][n][2 * h2], acc[mt][n][2 * h2 + 1]);
                if (warp == 0 && fq == 0) o[128] = stat[rr][0], o[129] = stat[rr][1];
            }
    }
#endif
}

#define ATT_SPLIT(R)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256) unmask_attention_split_r##R##_bf16_d128(                  \
        const unsigned short* q, const uint4* k, const unsigned short* v, const unsigned short* mask,         \
        float* part, int t_len, int heads, int kvh, int cap, int keys, float scale) {                        \
        attention_split<R>(q, k, v, mask, part, t_len, heads, kvh, cap, keys, scale);                         \
    }
ATT_SPLIT(8)
ATT_SPLIT(16)
ATT_SPLIT(32)

// grid (H, T), block 1024: row (h, t)'s chunks merged into out [T, H * 128] (bf16). Each of the
// 32 warps folds every 32nd chunk into a running (max, sum, V sum) with its lanes across d (4
// values a lane), so a long cache's hundreds of chunks are read 32 at a time, not in one
// serial loop; the warps' partials are then folded the same way through shared memory. (With
// 8 warps, and a chunk's loads waiting on a branch on its max, each chunk cost two round trips
// to the L2, one after another: the merge took twice as long; docs/tuning.md.)
#define MERGE_WARPS 32
extern "C" __global__ void __launch_bounds__(1024) unmask_attention_merge_bf16_d128(
    const float* __restrict__ part, unsigned short* __restrict__ out, int t_len, int heads, int kvh, int chunks) {
    __shared__ float wm[MERGE_WARPS], wl[MERGE_WARPS], wacc[MERGE_WARPS][128];
    pdl_enter();
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = heads / kvh, g = h / group, rows = group * t_len, r = (h % group) * t_len + t;
    const float* base = part + ((long)g * chunks * rows + r) * SPLIT_STRIDE;
    float m = NEG_INF, l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // no branch on a chunk's max before its other loads: the loads of 4 chunks go out together
#pragma unroll 4
    for (int c = warp; c < chunks; c += MERGE_WARPS) {
        const float* p = base + (long)c * rows * SPLIT_STRIDE;
        const float mc = p[128], lc = p[129];
        const float4 v = *(const float4*)(p + 4 * lane);
        const float mn = fmaxf(m, mc);
        // a chunk every key of which the mask hides has max -inf, sum 0 and V sum 0: weight 0
        const float a = m == NEG_INF ? 0.0f : expf(m - mn), b = mc == NEG_INF ? 0.0f : expf(mc - mn);
        l = l * a + lc * b;
        acc[0] = acc[0] * a + v.x * b;
        acc[1] = acc[1] * a + v.y * b;
        acc[2] = acc[2] * a + v.z * b;
        acc[3] = acc[3] * a + v.w * b;
        m = mn;
    }
    if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
    for (int e = 0; e < 4; ++e) wacc[warp][4 * lane + e] = acc[e];
    __syncthreads();
    if (threadIdx.x >= 128) return;
    const int i = threadIdx.x;
    float mt = NEG_INF;
    for (int w = 0; w < MERGE_WARPS; ++w) mt = fmaxf(mt, wm[w]);
    float num = 0.0f, den = 0.0f;
    for (int w = 0; w < MERGE_WARPS; ++w) {
        if (wm[w] == NEG_INF) continue;
        const float s = expf(wm[w] - mt);
        num = fmaf(s, wacc[w][i], num);
        den = fmaf(s, wl[w], den);
    }
    st(out, (long)t * heads * 128 + (long)h * 128 + i, num / den);
}
