// Routing a MoE layer's block pass (Qwen3-MoE, SDAR-30B-A3B; LLaDA2) for the grouped expert
// products of kernels/gemv.cu, which includes this file (NVRTC gets it as the named header
// "moe.cuh": src/model/cuda/nvrtc.rs). After the router's logits [T, E] (bf16, gemv.cu's norm
// form: the post-attention norm folded into the router's columns, as into every expert's
// gate|up), unmask_moe_route writes the layer's table (route_any: softmax over all experts in
// f32, the top k, exact ties to the lower expert id, a NaN logit below every number, PyTorch's
// order on ties being its sort's, src/model/topk.rs; renormalised when the config says so), or
// unmask_moe_route_grouped LLaDA2's (route_grouped_any: the grouped sigmoid router), the grouped
// gate|up and down products multiply from it, and unmask_moe_combine sums each row's k slots
// plus the residual (gemv.cu). Every shape depends only on T, E and k, and nothing comes back to
// the host, so the pass stays one CUDA graph. `stats` counts distinct experts and passes, for
// the floor's byte count.
#ifndef UNMASK_MOE_CUH
#define UNMASK_MOE_CUH

#include "common.cuh"  // MoeTable, to_bf16

__device__ __forceinline__ float bf16_to_f32(unsigned short v) { return __uint_as_float(((unsigned)v) << 16); }

#define NEG_INF_ROUTE __int_as_float(0xff800000)

// Experts a layer may have (src/model/moe_grouped.rs, MAX_EXPERTS), and the shared-memory
// words route_block needs for `e` of them (src/model/moe_grouped.rs, route_scratch_bytes).
#define ROUTE_MAX_EXPERTS 1024
#define ROUTE_SCRATCH_WORDS(e) (3 * MOE_SLOTS + (e))

// A logit's rank as one u32, larger = ranked first: the bf16 bits mapped to an order-preserving
// u16 (negative values' bits flipped, positive values' sign bit set: the order of Rust's
// f32::total_cmp, which the CPU route sorts by, -0 below +0 included), above 0xffff - i, so
// equal logits rank the lower id first. NaN maps to 0 (below -inf: never chosen while a number
// is left), where total_cmp ranks a positive NaN first: the two routes differ only for a NaN
// logit, whose row's output is NaN either way (and the pass refused downstream). Every key of
// an expert is > 0: 0 marks "no candidate".
__device__ __forceinline__ unsigned rank_key(unsigned short v, int i) {
    unsigned o;
    if ((v & 0x7fffu) > 0x7f80u) o = 0u;
    else o = (v & 0x8000u) ? (~(unsigned)v & 0xffffu) : ((unsigned)v | 0x8000u);
    return (o << 16) | (0xffffu - (unsigned)i);
}

// The logit (f32) and the expert of a key from rank_key.
__device__ __forceinline__ float key_value(unsigned key) {
    const unsigned o = key >> 16;
    return bf16_to_f32((unsigned short)((o & 0x8000u) ? (o & 0x7fffu) : (~o & 0xffffu)));
}
__device__ __forceinline__ int key_expert(unsigned key) { return (int)(0xffffu - (key & 0xffffu)); }

__device__ __forceinline__ unsigned warp_max(unsigned v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xffffffffu, v);  // one instruction
#else
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
#endif
}

// Routes `t_len` rows of router logits [t_len, e] (bf16) into the table `s` (shared memory).
// Every thread of the block calls it (it has barriers); any block of at least one warp.
// Each warp routes rows warp, warp + warps, ...: the row's values in its lanes' registers
// (expert i at lane i % 32, register i / 32; EPL registers a lane, 4 for 128 experts), so the
// softmax and the k rounds of the top-k (a lane's best untaken key, then one warp-wide max)
// never go back to memory. Then one warp builds the table: each expert's first slot by an
// atomic min in shared memory, the distinct experts numbered by a ballot.
// (Re-reading the logits every round with the table built on one thread in global memory,
// or float shuffles for each round's best and a scan over the slots for the first of each
// expert, write the same tables more slowly; docs/tuning.md, "route kernel".)
// `scratch`: ROUTE_SCRATCH_WORDS(e) words of shared memory the caller lends (route_scratch: one
// scratch for the three forms of route_any, where static arrays in each would take shared
// memory three times).
__device__ __forceinline__ void table_from_picks(int t_len, int k, MoeTable* s, int* scratch);

template <int EPL>
__device__ void route_block(const unsigned short* logits, int t_len, int e, int k, int norm, MoeTable* s, int* scratch) {
    // scratch: [slot] its expert, [slot] its probability, then table_from_picks's [first slot]
    // distinct expert number and [expert] lowest slot
    int* pick = scratch;
    float* prob = (float*)(scratch + MOE_SLOTS);
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int t = threadIdx.x >> 5; t < t_len; t += warps) {
        const unsigned short* z = logits + (long)t * e;
        unsigned key[EPL];
        float v[EPL];
        unsigned top = 0u;
#pragma unroll
        for (int r = 0; r < EPL; ++r) {
            const int i = r * 32 + lane;
            const unsigned short b = i < e ? z[i] : (unsigned short)0;
            v[r] = bf16_to_f32(b);
            key[r] = i < e ? rank_key(b, i) : 0u;
            top = max(top, key[r]);
        }
        // the largest logit (NaN aside, as fmaxf would find it): the first pick's
        const float mx = key_value(warp_max(top));
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < EPL; ++r)
            if (r * 32 + lane < e) sum += expf(v[r] - mx);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        float ps = 0.0f;
        for (int j = 0; j < k; ++j) {
            unsigned m = 0u;
#pragma unroll
            for (int r = 0; r < EPL; ++r) m = max(m, key[r]);
            m = warp_max(m);
            const int i = key_expert(m);
#pragma unroll
            for (int r = 0; r < EPL; ++r)
                if (key[r] == m) key[r] = 0u;  // taken (keys are distinct: one lane, one register)
            const float p = expf(key_value(m) - mx) / sum;
            ps += p;
            if (lane == 0) pick[t * k + j] = i, prob[t * k + j] = p;
        }
        __syncwarp();
        if (norm && lane < k) prob[t * k + lane] /= ps;
    }
    __syncthreads();
    table_from_picks(t_len, k, s, scratch);
}

// The table `s` from a pass's picks: `scratch` holds, for every slot t * k + j, its expert
// (pick, words [0, MOE_SLOTS)) and weight (prob, the next MOE_SLOTS), as route_block and
// route_grouped_block leave them. One warp builds it: each expert's first slot by an atomic min
// in shared memory, the distinct experts numbered by a ballot. Every thread of the block calls
// it (it ends on a barrier), after a barrier that published the picks.
__device__ __forceinline__ void table_from_picks(int t_len, int k, MoeTable* s, int* scratch) {
    const int* pick = scratch;
    const float* prob = (const float*)(scratch + MOE_SLOTS);
    int* u_of = scratch + 2 * MOE_SLOTS;
    int* first_of = scratch + 3 * MOE_SLOTS;
    const int lane = threadIdx.x & 31;
    const int slots = t_len * k;
    if (threadIdx.x < 32) {
        for (int sl = lane; sl < slots; sl += 32) first_of[pick[sl]] = MOE_SLOTS;
        __syncwarp();
        for (int sl = lane; sl < slots; sl += 32) atomicMin(&first_of[pick[sl]], sl);
        __syncwarp();
        int count = 0;
        for (int c = 0; c < slots; c += 32) {
            const int sl = c + lane;
            const bool first = sl < slots && first_of[pick[sl]] == sl;
            const unsigned b = __ballot_sync(0xffffffffu, first);
            if (first) {
                const int u = count + __popc(b & ((1u << lane) - 1u));
                u_of[sl] = u;
                s->expert[u] = pick[sl];
                s->rows[u] = 0u;
            }
            count += __popc(b);
        }
        __syncwarp();
        for (int sl = lane; sl < slots; sl += 32) {
            const int u = u_of[first_of[pick[sl]]], t = sl / k;
            atomicOr(&s->rows[u], 1u << t);
            s->slot[u][t] = sl;
            s->topk[sl] = pick[sl];
            s->weight[sl] = prob[sl];
        }
        if (lane == 0) s->count = count, s->k = k;
    }
    __syncthreads();
}

// The block's dynamic shared memory as the routing's scratch. Declared apart from gemv's: an
// `extern __shared__` array declared in a template and again in a kernel conflicts in linkage.
__device__ __forceinline__ int* route_scratch() {
    extern __shared__ uint4 route_dynamic[];
    return (int*)route_dynamic;
}

// route_block with the registers a lane needs for `e` experts (at most ROUTE_MAX_EXPERTS).
__device__ __forceinline__ void route_any(const unsigned short* logits, int t_len, int e, int k, int norm, MoeTable* s,
                                          int* scratch) {
    if (e <= 128)
        route_block<4>(logits, t_len, e, k, norm, s, scratch);
    else if (e <= 256)
        route_block<8>(logits, t_len, e, k, norm, s, scratch);
    else
        route_block<32>(logits, t_len, e, k, norm, s, scratch);
}

// A candidate's rank for the grouped router: a larger value first, equal values the lower id
// first (a fixed rule the CPU body, src/model/fast/moe_grouped.rs, applies too).
__device__ __forceinline__ bool ranks_before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

// The warp's best (value, id) by ranks_before and the score that goes with it, in every lane.
__device__ __forceinline__ void warp_best(float& v, int& i, float& sc) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o), os = __shfl_xor_sync(0xffffffffu, sc, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ranks_before(ov, oi, v, i)) v = ov, i = oi, sc = os;
    }
}

#define ROUTE_NONE 0x7fffffff  // the id of "no candidate": ranked after every expert

// LLaDA2's group-limited sigmoid router (src/model/layers/router.rs) over `t_len` rows of router
// logits [t_len, e] (bf16) into the table `s`: per row (a warp, expert i at lane i % 32,
// register i / 32 as in route_block) the score sigmoid(z) and the biased score + bias[i] (f32;
// a NaN ranks as -inf); each of the `groups` groups of e / groups experts ranked by the sum of
// its two best biased scores (lane g sums group g from the row in shared memory; at most 32
// groups); the `keep` best groups kept; the k best biased scores among their experts chosen;
// weights the chosen scores over their sum (+ 1e-20, for k > 1) times `scale`. Equal values
// rank the lower group or expert first. Then table_from_picks. `scratch`:
// ROUTE_GROUPED_SCRATCH_WORDS(e, warps) words (the rows' biased scores after route_block's).
#define ROUTE_GROUPED_SCRATCH_WORDS(e, warps) (ROUTE_SCRATCH_WORDS(e) + (warps) * (e))
template <int EPL>
__device__ void route_grouped_block(const unsigned short* logits, const float* bias, int t_len, int e, int k,
                                    int groups, int keep, float scale, MoeTable* s, int* scratch) {
    int* pick = scratch;
    float* prob = (float*)(scratch + MOE_SLOTS);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float* rb = (float*)(scratch + ROUTE_SCRATCH_WORDS(e)) + (long)warp * e;  // this warp's row
    const int size = e / groups;
    for (int t = warp; t < t_len; t += warps) {
        const unsigned short* z = logits + (long)t * e;
        float sc[EPL], bv[EPL];
        bool taken[EPL];
#pragma unroll
        for (int r = 0; r < EPL; ++r) {
            const int i = r * 32 + lane;
            float g = 0.0f, b = NEG_INF_ROUTE;
            if (i < e) {
                g = 1.0f / (1.0f + expf(-bf16_to_f32(z[i])));
                b = g + bias[i];
                if (b != b) b = NEG_INF_ROUTE;
                rb[i] = b;
            }
            sc[r] = g;
            bv[r] = b;
            taken[r] = i >= e;
        }
        __syncwarp();
        float gv = NEG_INF_ROUTE;
        int gi = ROUTE_NONE;
        if (lane < groups) {
            float a = NEG_INF_ROUTE, c = NEG_INF_ROUTE;
            for (int j = lane * size; j < (lane + 1) * size; ++j) {
                const float x = rb[j];
                if (x > a) c = a, a = x;
                else if (x > c) c = x;
            }
            gv = a + c;
            gi = lane;
        }
        unsigned kept = 0u;
        for (int j = 0; j < keep; ++j) {
            float v = gv, unused = 0.0f;
            int i = gi;
            warp_best(v, i, unused);
            kept |= 1u << i;
            if (gi == i) gv = NEG_INF_ROUTE, gi = ROUTE_NONE;  // taken
        }
        float ps = 0.0f;
        for (int j = 0; j < k; ++j) {
            float v = NEG_INF_ROUTE, pv = 0.0f;
            int i = ROUTE_NONE;
#pragma unroll
            for (int r = 0; r < EPL; ++r) {
                const int x = r * 32 + lane;
                const float b = (x < e && ((kept >> (x / size)) & 1u)) ? bv[r] : NEG_INF_ROUTE;
                if (!taken[r] && ranks_before(b, x, v, i)) v = b, i = x, pv = sc[r];
            }
            warp_best(v, i, pv);
#pragma unroll
            for (int r = 0; r < EPL; ++r)
                if (r * 32 + lane == i) taken[r] = true;
            ps += pv;
            if (lane == 0) pick[t * k + j] = i, prob[t * k + j] = pv;
        }
        __syncwarp();
        if (lane < k) prob[t * k + lane] = (k > 1 ? prob[t * k + lane] / (ps + 1e-20f) : prob[t * k + lane]) * scale;
        __syncwarp();  // the row's scores read before the warp's next row rewrites them
    }
    __syncthreads();
    table_from_picks(t_len, k, s, scratch);
}

// route_grouped_block with the registers a lane needs for `e` experts (at most ROUTE_MAX_EXPERTS).
__device__ __forceinline__ void route_grouped_any(const unsigned short* logits, const float* bias, int t_len, int e,
                                                  int k, int groups, int keep, float scale, MoeTable* s,
                                                  int* scratch) {
    if (e <= 128)
        route_grouped_block<4>(logits, bias, t_len, e, k, groups, keep, scale, s, scratch);
    else if (e <= 256)
        route_grouped_block<8>(logits, bias, t_len, e, k, groups, keep, scale, s, scratch);
    else
        route_grouped_block<32>(logits, bias, t_len, e, k, groups, keep, scale, s, scratch);
}

// The table `s` built by route_block out to `g` (the words the grouped products and the host
// read), and the counters advanced: distinct experts, passes. Every thread of the block calls it.
__device__ __forceinline__ void store_table(const MoeTable* s, MoeTable* g, unsigned long long* stats, int t_len) {
    const int count = s->count, slots = t_len * s->k;
    // a row's slot only where the row chose the expert (the others are left as they were)
    for (int i = threadIdx.x; i < count * 8; i += blockDim.x)
        if ((s->rows[i / 8] >> (i % 8)) & 1u) g->slot[i / 8][i % 8] = s->slot[i / 8][i % 8];
    for (int i = threadIdx.x; i < count; i += blockDim.x) g->expert[i] = s->expert[i], g->rows[i] = s->rows[i];
    for (int i = threadIdx.x; i < slots; i += blockDim.x) g->topk[i] = s->topk[i], g->weight[i] = s->weight[i];
    if (threadIdx.x == 0) {
        g->count = count;
        g->k = s->k;
        if (stats) {
            atomicAdd(&stats[0], (unsigned long long)count);
            atomicAdd(&stats[1], 1ull);
        }
    }
}

#endif
