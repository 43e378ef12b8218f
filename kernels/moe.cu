// The MoE block of a block pass on the GPU (Qwen3-MoE routing, SDAR-30B-A3B), around the
// grouped expert products of kernels/gemv.cu:
//   1. router logits [T, E] bf16: gemv.cu's norm form (the post-attention norm folded into the
//      router's columns, as into every expert's gate|up);
//   2. unmask_moe_route (here): softmax over all experts in f32, the top k (exact ties: the
//      lower expert id; PyTorch's order on ties is its sort's, src/model/topk.rs), renormalised when the config says so, and
//      the routing table the grouped products read: the distinct experts the pass touched, the
//      rows of each, each row's slots and weights;
//   3. unmask_gemv_moe_up_u4: silu(gate) * up of every (row, choice) slot, one launch over the
//      distinct experts (grid.y = T * k slots, blocks past the count return);
//   4. unmask_gemv_moe_down_u8: each slot's down product times its weight, f32;
//   5. unmask_moe_combine (here): the k slots of a row summed in order, rounded to bf16, plus
//      the residual.
// Every shape depends only on T, E and k, and nothing comes back to the host, so the pass stays
// one CUDA graph. `stats` counts distinct experts and passes, for the floor's byte count.

#include "common.cuh"  // dependency_wait, launch_dependents, to_bf16, MoeTable

#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float bf16_to_f32(unsigned short v) { return __uint_as_float(((unsigned)v) << 16); }

// Which of two candidates ranks first: the larger value, the lower index on a tie.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// One block of 32 * t_len threads: warp t routes row t, every value of the row held in its
// lanes' registers (expert i at lane i % 32, register i / 32; EPL registers a lane, the fewest
// that hold the row, so 128 experts loop over 4), so the softmax and the k rounds of the top-k
// (a lane's best untaken value, then a warp reduction) never go back to memory; then the
// t_len * k slots are indexed in parallel, one thread a slot, in shared memory, and written
// out. (The first version re-read the logits every round and built the table on one thread in
// global memory: 15 us a layer on the H200 under ncu, the pass's third-largest kernel;
// docs/perf.md.) Experts at most 32 * 32 = 1024, k at most 8, t_len at most 8.
template <int EPL>
__device__ void route(const unsigned short* __restrict__ logits, MoeTable* __restrict__ tab,
                      unsigned long long* __restrict__ stats, int t_len, int e, int k, int norm) {
    __shared__ int pick[MOE_SLOTS];
    __shared__ float prob[MOE_SLOTS];
    __shared__ int first[MOE_SLOTS];  // the lowest slot holding the same expert
    launch_dependents();
    dependency_wait();
    const int lane = threadIdx.x & 31, t = threadIdx.x >> 5;
    if (t < t_len) {
        const unsigned short* z = logits + (long)t * e;
        float v[EPL];
        float mx = NEG_INF;
#pragma unroll
        for (int r = 0; r < EPL; ++r) {
            const int i = r * 32 + lane;
            v[r] = i < e ? bf16_to_f32(z[i]) : NEG_INF;
            mx = fmaxf(mx, v[r]);
        }
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < EPL; ++r)
            if (r * 32 + lane < e) sum += expf(v[r] - mx);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        unsigned taken = 0u;  // bit r: this lane's expert r * 32 + lane is chosen
        float s = 0.0f;
        for (int j = 0; j < k; ++j) {
            float bv = NEG_INF;
            int bi = 0x7fffffff;
#pragma unroll
            for (int r = 0; r < EPL; ++r) {
                const int i = r * 32 + lane;
                if (i < e && !((taken >> r) & 1u) && better(v[r], i, bv, bi)) bv = v[r], bi = i;
            }
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
            }
            // NaN logits rank nowhere: a valid expert still (its outputs turn NaN, and the pass
            // is refused downstream), never an index past the weights
            if (bi >= e) bi = j % e;
            if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
            const float p = expf(bv - mx) / sum;
            s += p;
            if (lane == 0) pick[t * k + j] = bi, prob[t * k + j] = p;
        }
        __syncwarp();
        if (norm && lane < k) prob[t * k + lane] /= s;
    }
    __syncthreads();
    const int slots = t_len * k, sl = threadIdx.x;
    if (sl < slots) {
        int f = sl;
        for (int o = 0; o < sl; ++o)
            if (pick[o] == pick[sl]) {
                f = o;
                break;
            }
        first[sl] = f;
    }
    __syncthreads();
    // A first slot's number: the first slots before it (in slot order: first-seen order)
    if (sl < slots && first[sl] == sl) {
        int u = 0;
        for (int o = 0; o < sl; ++o) u += first[o] == o;
        tab->expert[u] = pick[sl];
        unsigned rows = 0u;
        for (int o = sl; o < slots; ++o)
            if (first[o] == sl) rows |= 1u << (o / k), tab->slot[u][o / k] = o;
        tab->rows[u] = rows;
    }
    __syncthreads();
    if (sl < slots) {
        tab->topk[sl] = pick[sl];
        tab->weight[sl] = prob[sl];
    }
    if (sl == 0) {
        int count = 0;
        for (int o = 0; o < slots; ++o) count += first[o] == o;
        tab->count = count;
        tab->k = k;
        if (stats) {
            atomicAdd(&stats[0], (unsigned long long)count);
            atomicAdd(&stats[1], 1ull);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) unmask_moe_route(const unsigned short* __restrict__ logits,
                                                                   MoeTable* __restrict__ tab,
                                                                   unsigned long long* __restrict__ stats, int t_len,
                                                                   int e, int k, int norm) {
    if (e <= 128)
        route<4>(logits, tab, stats, t_len, e, k, norm);
    else if (e <= 256)
        route<8>(logits, tab, stats, t_len, e, k, norm);
    else
        route<32>(logits, tab, stats, t_len, e, k, norm);
}

// out [T, H] = bf16(bf16(sum_j part[t * k + j]) + res[t]): the MoE output plus the residual,
// rounded as the dense layer's down product + add rounds. `out` may be `res`.
extern "C" __global__ void unmask_moe_combine(const float* __restrict__ part, const unsigned short* res,
                                              unsigned short* out, int t_len, int h, int k) {
    launch_dependents();
    dependency_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= t_len * h) return;
    const int t = i / h, col = i % h;
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s += part[(long)(t * k + j) * h + col];
    out[i] = to_bf16(bf16_to_f32(to_bf16(s)) + bf16_to_f32(res[i]));
}
