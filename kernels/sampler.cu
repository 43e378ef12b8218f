// The per-step sampler of a denoising pass, in two launches for the whole block of positions:
// unmask_sample_stats_* (grid rows x SEG) reduces SEG spans of every row in parallel, then
// unmask_sample_* (one thread block per position, i.e. row of logits) combines them and decides. For every row it writes four floats:
//   out[4r+0] token id (exact in f32: ids < 2^24)
//   out[4r+1] confidence: probability of that token under the distribution it came from
//   out[4r+2] entropy (nats) of that distribution
//   out[4r+3] flag: 0 = done, 1 = the row needs the host sampler (see OVERFLOW below)
// Semantics: src/sampler/mod.rs (`sample`), which stays the reference. The algorithm below is
// mirrored step for step on the CPU by src/sampler/kernel.rs, whose unit tests check it against
// the reference; the GPU run checks this kernel against the reference on the device's logits.
//
// Compiled at run time by NVRTC (src/sampler/cuda.rs) with --fmad=false, so that the serial
// tail does the same f32 operations in the same order as the CPU reference. No #include: NVRTC
// needs no headers, and bf16 is read as raw bits.
//
// Greedy (temperature 0): one pass, online (max, argmax, sum e^(x-m), sum e^(x-m)(x-m)) per
//   thread, combined by warp shuffles, then across warps, then across the SEG spans. conf = 1/S, entropy = ln S - W/S.
// Temperature: x = z * inv_t. The same pass gives m, S, W, and the count of eligible tokens.
//   Then a 4-digit radix select finds the K-th largest key (K = top_k, or KMAX), an ordered
//   gather takes every key above it and the lowest ids among the keys equal to it, a bitonic
//   sort orders the K candidates (value desc, id asc) and thread 0 runs the reference's tail
//   (exp, filter p > 0, total, top-p cut, renormalise, entropy, inverse-CDF draw) serially.
//   - exact mode (top_k in 1..=KMAX, or every eligible token fits in KMAX): bit-for-bit the
//     reference's operations (up to expf/logf rounding).
//   - partial mode (no top-k, more than KMAX tokens): the candidates are the KMAX best of the
//     whole distribution, normalised by the full sum S. The top-p cut and the draw are exact as
//     long as they land inside the KMAX best; otherwise OVERFLOW asks the host to redo the row.
//   - top_k > KMAX (and < vocab): always OVERFLOW.
// The mask token (mask_id) is never eligible, like a -inf logit; NaN logits are ignored, as
// the reference ignores them.

#define NT 512
#define WARPS (NT / 32)
#define KMAX 256
#define TILE_PER_THREAD 8
#define PREFETCH 8
#define SEG 32  // spans per row in sample_stats: one warp combines them
#define NEG_INF (__int_as_float(0xff800000))

struct Acc {
    float m;       // max of x
    float s;       // sum of e^(x - m)
    float w;       // sum of e^(x - m) * (x - m)
    unsigned arg;  // lowest id holding m
    unsigned n;    // eligible tokens seen
};

__device__ __forceinline__ float load_x(const float* p, unsigned i) { return p[i]; }
__device__ __forceinline__ float load_x(const unsigned short* p, unsigned i) {
    return __uint_as_float(((unsigned)p[i]) << 16);
}

// Adds one eligible value (x > -inf) at index i; indices arrive in increasing order per thread.
__device__ __forceinline__ void acc_push(Acc& a, float x, unsigned i) {
    a.n += 1;
    if (a.s == 0.0f) {
        a.m = x; a.s = 1.0f; a.w = 0.0f; a.arg = i;
    } else if (x > a.m) {
        float d = a.m - x;
        float e = expf(d);
        a.w = e * (a.w + d * a.s);
        a.s = e * a.s + 1.0f;
        a.m = x;
        a.arg = i;
    } else {
        float d = x - a.m;
        float e = expf(d);
        a.s = a.s + e;
        a.w = a.w + e * d;
    }
}

__device__ __forceinline__ Acc acc_empty() {
    Acc a; a.m = NEG_INF; a.s = 0.0f; a.w = 0.0f; a.arg = 0xffffffffu; a.n = 0;
    return a;
}

__device__ __forceinline__ Acc acc_load(const float* p) {
    Acc a; a.m = p[0]; a.s = p[1]; a.w = p[2]; a.arg = __float_as_uint(p[3]); a.n = __float_as_uint(p[4]);
    return a;
}

// Commutative: combine(a, b) and combine(b, a) give the same bits.
__device__ __forceinline__ Acc acc_combine(Acc a, Acc b) {
    if (b.s == 0.0f) { a.n += b.n; return a; }
    if (a.s == 0.0f) { b.n += a.n; return b; }
    Acc r;
    r.m = fmaxf(a.m, b.m);
    if (a.m > b.m) r.arg = a.arg;
    else if (b.m > a.m) r.arg = b.arg;
    else r.arg = min(a.arg, b.arg);
    float da = a.m - r.m, db = b.m - r.m;
    float ea = expf(da), eb = expf(db);
    r.s = ea * a.s + eb * b.s;
    r.w = ea * (a.w + da * a.s) + eb * (b.w + db * b.s);
    r.n = a.n + b.n;
    return r;
}

__device__ __forceinline__ Acc acc_shfl_xor(const Acc& a, int off) {
    Acc b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, off);
    b.s = __shfl_xor_sync(0xffffffffu, a.s, off);
    b.w = __shfl_xor_sync(0xffffffffu, a.w, off);
    b.arg = __shfl_xor_sync(0xffffffffu, a.arg, off);
    b.n = __shfl_xor_sync(0xffffffffu, a.n, off);
    return b;
}

// Lane 0 of each warp ends with the warp's combination: ((l0+l16)+(l8+l24))+... (butterfly).
__device__ __forceinline__ Acc acc_warp(Acc a) {
    for (int off = 16; off > 0; off >>= 1) a = acc_combine(a, acc_shfl_xor(a, off));
    return a;
}

// Orderable key of an eligible value: larger float, larger key; every eligible key > 0.
__device__ __forceinline__ unsigned fkey(float x) {
    unsigned u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float fkey_inv(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

template <typename T>
__device__ __forceinline__ bool value_at(const T* row, unsigned i, unsigned mask_id, float inv_t, bool scale, float& x) {
    if (i == mask_id) return false;
    float z = load_x(row, i);
    x = scale ? z * inv_t : z;
    return x > NEG_INF;  // false for -inf and NaN
}

// value_at for a logit already loaded.
__device__ __forceinline__ bool value_of(float z, unsigned i, unsigned mask_id, float inv_t, bool scale, float& x) {
    if (i == mask_id) return false;
    x = scale ? z * inv_t : z;
    return x > NEG_INF;
}

// Exclusive block-wide scan of one unsigned per thread; also returns the total.
__device__ __forceinline__ unsigned block_scan(unsigned v, unsigned* warp_tot, unsigned& total) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned inc = v;
    for (int off = 1; off < 32; off <<= 1) {
        unsigned t = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= (unsigned)off) inc += t;
    }
    if (lane == 31) warp_tot[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        unsigned t = lane < WARPS ? warp_tot[lane] : 0u;
        unsigned winc = t;
        for (int off = 1; off < 32; off <<= 1) {
            unsigned u = __shfl_up_sync(0xffffffffu, winc, off);
            if (lane >= (unsigned)off) winc += u;
        }
        if (lane < WARPS) warp_tot[lane] = winc - t;  // exclusive warp offsets
        if (lane == 31) warp_tot[WARPS] = winc;
    }
    __syncthreads();
    unsigned r = warp_tot[warp] + inc - v;
    total = warp_tot[WARPS];
    __syncthreads();
    return r;
}

// The online pass over one of SEG equal spans of a row (grid rows x SEG): every SM reads a
// slice of the logits, instead of one SM a whole row. Thread tid takes ids lo + tid,
// lo + tid + NT, ... below hi; the block's partial goes to part[row][seg].
template <typename T>
__device__ void sample_stats(const T* __restrict__ logits, float* __restrict__ part, unsigned vocab,
                             unsigned mask_id, int greedy, float inv_t) {
    const unsigned row = blockIdx.x, seg = blockIdx.y;
    const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const T* r = logits + (size_t)row * vocab;
    const bool scale = !greedy;
    const unsigned span = (vocab + SEG - 1) / SEG;
    const unsigned lo = seg * span, hi = min(lo + span, vocab);
    __shared__ Acc warp_acc[WARPS];
    Acc a = acc_empty();
    // Loads of PREFETCH ids (tid, tid + NT, ...) are issued together, then pushed in that
    // order: the same pushes as one id at a time, without a memory round trip per id.
    for (unsigned base = lo + tid; base < hi; base += NT * PREFETCH) {
        float z[PREFETCH];
#pragma unroll
        for (int u = 0; u < PREFETCH; ++u) {
            const unsigned i = base + u * NT;
            z[u] = i < hi ? load_x(r, i) : NEG_INF;
        }
#pragma unroll
        for (int u = 0; u < PREFETCH; ++u) {
            const unsigned i = base + u * NT;
            float x;
            if (i < hi && value_of(z[u], i, mask_id, inv_t, scale, x)) acc_push(a, x, i);
        }
    }
    a = acc_warp(a);
    if (lane == 0) warp_acc[warp] = a;
    __syncthreads();
    if (warp == 0) {
        Acc b = lane < WARPS ? warp_acc[lane] : acc_empty();
        b = acc_warp(b);
        if (lane == 0) {
            float* p = part + ((size_t)row * SEG + seg) * 5;
            p[0] = b.m; p[1] = b.s; p[2] = b.w; p[3] = __uint_as_float(b.arg); p[4] = __uint_as_float(b.n);
        }
    }
}

// The row is the host's to sample (flag 1), its argmax in the token slot.
__device__ __forceinline__ void hand_to_host(float* out, unsigned row, const Acc& t) {
    out[4 * row + 0] = (float)t.arg;
    out[4 * row + 1] = 0.0f;
    out[4 * row + 2] = 0.0f;
    out[4 * row + 3] = 1.0f;
}

template <typename T>
__device__ void sample_row(const T* __restrict__ logits, const float* __restrict__ part,
                           const float* __restrict__ uniforms, float* __restrict__ out, unsigned vocab,
                           unsigned mask_id, int greedy, float inv_t, unsigned top_k, float top_p, int scaled,
                           int ties) {
    const unsigned row = blockIdx.x;
    const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const T* r = logits + (size_t)row * vocab;
    const bool scale = !greedy;

    __shared__ Acc total_acc;
    __shared__ unsigned hist[256];
    __shared__ unsigned sel[4];  // prefix, remaining rank, keys equal to the prefix, (unused)
    __shared__ unsigned long long cand[KMAX];
    __shared__ unsigned scan_tmp[WARPS + 1];
    __shared__ unsigned n_gt, eq_base;
    __shared__ float pe[KMAX];
    __shared__ unsigned pid[KMAX];

    // 1. the row's (m, S, W, arg, n): the SEG partials of sample_stats, combined by a butterfly
    if (warp == 0) {
        Acc b = acc_load(part + ((size_t)row * SEG + lane) * 5);
        b = acc_warp(b);
        if (lane == 0) total_acc = b;
    }
    __syncthreads();
    const Acc t = total_acc;

    if (greedy) {
        if (tid == 0) {
            out[4 * row + 0] = (float)t.arg;
            out[4 * row + 1] = 1.0f / t.s;
            out[4 * row + 2] = logf(t.s) - t.w / t.s;
            out[4 * row + 3] = 0.0f;
        }
        return;
    }

    // 2. how many candidates, and in which mode
    // mode 0: exact, 1: partial (normalise by the full sum), 2: overflow
    bool truncates = top_k > 0 && top_k < vocab;
    unsigned K, mode;
    if (truncates && top_k <= KMAX) { K = min(top_k, t.n); mode = 0; }
    else if (truncates) { K = 0; mode = 2; }
    else if (t.n <= KMAX) { K = t.n; mode = 0; }
    else { K = KMAX; mode = 1; }
    if (mode == 2 || K == 0) {
        if (tid == 0) hand_to_host(out, row, t);
        return;
    }

    // 3. radix select of the K-th largest key, 8 bits at a time
    if (tid == 0) { sel[0] = 0; sel[1] = K; }
    unsigned pmask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (unsigned j = tid; j < 256; j += NT) hist[j] = 0;
        __syncthreads();
        const unsigned prefix = sel[0];
        for (unsigned i = tid; i < vocab; i += NT) {
            float x;
            if (value_at(r, i, mask_id, inv_t, scale, x)) {
                unsigned k = fkey(x);
                if ((k & pmask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
            }
        }
        __syncthreads();
        if (tid == 0) {
            unsigned kk = sel[1], cum = 0, d = 255;
            for (int dd = 255; dd >= 0; --dd) {
                if (cum + hist[dd] >= kk) { d = (unsigned)dd; break; }
                cum += hist[dd];
            }
            sel[0] = prefix | (d << shift);
            sel[1] = kk - cum;
            sel[2] = hist[d];  // after the last digit: every key equal to the K-th
        }
        pmask |= 255u << shift;
        __syncthreads();
    }
    const unsigned thr = sel[0];
    const unsigned n_above = K - sel[1];
    // how many keys equal to thr to take (the lowest ids); generate.py's top-k (ties) takes them
    // all, so K grows, and past KMAX the host samples the row
    const bool all_ties = ties && truncates;
    const unsigned need = all_ties ? sel[2] : sel[1];
    K = n_above + need;
    if (K > KMAX) {
        if (tid == 0) hand_to_host(out, row, t);
        return;
    }

    // 4. ordered gather: every key above thr (any order), the first `need` keys equal to thr
    //    in index order. Tiles of NT * TILE_PER_THREAD; thread tid owns a run of consecutive ids.
    if (tid == 0) { n_gt = 0; eq_base = 0; }
    for (unsigned j = tid; j < KMAX; j += NT) cand[j] = 0ull;
    __syncthreads();
    for (unsigned base = 0; base < vocab; base += NT * TILE_PER_THREAD) {
        unsigned first = base + tid * TILE_PER_THREAD;
        unsigned eq_count = 0;
        for (unsigned q = 0; q < TILE_PER_THREAD; ++q) {
            unsigned i = first + q;
            float x;
            if (i < vocab && value_at(r, i, mask_id, inv_t, scale, x)) {
                unsigned k = fkey(x);
                if (k > thr) {
                    unsigned slot = atomicAdd(&n_gt, 1u);
                    if (slot < n_above) cand[slot] = ((unsigned long long)k << 32) | (0xffffffffu - i);
                } else if (k == thr) {
                    eq_count += 1;
                }
            }
        }
        unsigned tile_eq;
        unsigned rank = block_scan(eq_count, scan_tmp, tile_eq);
        const unsigned eb = eq_base;
        if (eq_count > 0) {
            unsigned rr = eb + rank;
            for (unsigned q = 0; q < TILE_PER_THREAD && rr < need; ++q) {
                unsigned i = first + q;
                float x;
                if (i < vocab && value_at(r, i, mask_id, inv_t, scale, x) && fkey(x) == thr) {
                    cand[n_above + rr] = ((unsigned long long)thr << 32) | (0xffffffffu - i);
                    rr += 1;
                }
            }
        }
        __syncthreads();
        if (tid == 0) eq_base = eb + tile_eq;
        __syncthreads();
    }

    // 5. bitonic sort, descending (value desc, then id asc)
    for (unsigned size = 2; size <= KMAX; size <<= 1) {
        for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            if (tid < KMAX) {
                unsigned j = tid ^ stride;
                if (j > tid) {
                    bool desc = (tid & size) == 0;
                    unsigned long long p = cand[tid], q = cand[j];
                    if (desc ? (p < q) : (p > q)) { cand[tid] = q; cand[j] = p; }
                }
            }
        }
    }
    __syncthreads();

    // 6. the reference's tail, serially
    if (tid == 0) {
        const float u = uniforms[row];
        const float m = fkey_inv((unsigned)(cand[0] >> 32));
        unsigned n = 0;
        for (unsigned c = 0; c < K; ++c) {
            float x = fkey_inv((unsigned)(cand[c] >> 32));
            float e = expf(x - m);
            if (e > 0.0f) { pe[n] = e; pid[n] = 0xffffffffu - (unsigned)(cand[c] & 0xffffffffu); n += 1; }
        }
        float total = 0.0f;
        if (mode == 0) {
            for (unsigned c = 0; c < n; ++c) total = total + pe[c];
        } else {
            total = t.s;
        }
        unsigned keep = n;
        bool overflow = false;
        if (top_p < 1.0f) {
            float cum = 0.0f;
            bool reached = false;
            for (unsigned c = 0; c < n; ++c) {
                cum = cum + pe[c] / total;
                if (cum > top_p) { keep = c + 1; reached = true; break; }
            }
            if (!reached && mode == 1) overflow = true;
        }
        float token = 0.0f, conf = 0.0f, entropy = 0.0f;
        unsigned chosen_c = 0;  // the candidate drawn (scaled: its probability in the whole row)
        if (!overflow && (mode == 0 || top_p < 1.0f)) {
            // the kept set is known: renormalise over it
            float total2 = 0.0f;
            for (unsigned c = 0; c < keep; ++c) total2 = total2 + pe[c];
            for (unsigned c = 0; c < keep; ++c) pe[c] = pe[c] / total2;
            for (unsigned c = 0; c < keep; ++c) if (pe[c] > 0.0f) entropy = entropy + (-pe[c]) * logf(pe[c]);
            float cum = 0.0f;
            unsigned chosen = keep - 1;
            for (unsigned c = 0; c < keep; ++c) {
                cum = cum + pe[c];
                if (u < cum) { chosen = c; break; }
            }
            token = (float)pid[chosen];
            conf = pe[chosen];
            chosen_c = chosen;
        } else if (!overflow) {
            // partial mode, no top-p: the whole distribution, of which we hold the KMAX best
            entropy = logf(t.s) - t.w / t.s;
            float cum = 0.0f;
            bool found = false;
            for (unsigned c = 0; c < n; ++c) {
                float p = pe[c] / total;
                cum = cum + p;
                if (u < cum) { token = (float)pid[c]; conf = p; chosen_c = c; found = true; break; }
            }
            if (!found) overflow = true;
        }
        if (scaled && !overflow) {
            conf = expf(fkey_inv((unsigned)(cand[chosen_c] >> 32)) - t.m) / t.s;
            entropy = logf(t.s) - t.w / t.s;
        }
        out[4 * row + 0] = overflow ? (float)t.arg : token;
        out[4 * row + 1] = overflow ? 0.0f : conf;
        out[4 * row + 2] = overflow ? 0.0f : entropy;
        out[4 * row + 3] = overflow ? 1.0f : 0.0f;
    }
}

#define SAMPLE(SUFFIX, T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(NT) unmask_sample_stats_##SUFFIX(                          \
        const T* logits, float* part, unsigned vocab, unsigned mask_id, int greedy, float inv_t) {          \
        sample_stats<T>(logits, part, vocab, mask_id, greedy, inv_t);                                       \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(NT) unmask_sample_##SUFFIX(                                \
        const T* logits, const float* part, const float* uniforms, float* out, unsigned vocab,              \
        unsigned mask_id, int greedy, float inv_t, unsigned top_k, float top_p, int scaled, int ties) {     \
        sample_row<T>(logits, part, uniforms, out, vocab, mask_id, greedy, inv_t, top_k, top_p, scaled, ties); \
    }
SAMPLE(f32, float)
SAMPLE(bf16, unsigned short)
