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

// One block of 32 * t_len threads: warp t routes row t; then thread 0 writes the table.
// Experts at most 32 * 32 = 1024 (the taken-flags bitmask), k at most 8, t_len at most 8.
extern "C" __global__ void __launch_bounds__(256) unmask_moe_route(const unsigned short* __restrict__ logits,
                                                                   MoeTable* __restrict__ tab,
                                                                   unsigned long long* __restrict__ stats, int t_len,
                                                                   int e, int k, int norm) {
    __shared__ unsigned taken[8][32];
    __shared__ int pick[8][8];
    __shared__ float prob[8][8];
    launch_dependents();
    dependency_wait();
    const int lane = threadIdx.x & 31, t = threadIdx.x >> 5;
    if (t < t_len) {
        const unsigned short* z = logits + (long)t * e;
        taken[t][lane] = 0u;
        float mx = NEG_INF;
        for (int i = lane; i < e; i += 32) mx = fmaxf(mx, bf16_to_f32(z[i]));
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.0f;
        for (int i = lane; i < e; i += 32) sum += expf(bf16_to_f32(z[i]) - mx);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        __syncwarp();
        for (int j = 0; j < k; ++j) {
            float bv = NEG_INF;
            int bi = 0x7fffffff;
            for (int i = lane; i < e; i += 32) {
                const float v = bf16_to_f32(z[i]);
                if (!((taken[t][i >> 5] >> (i & 31)) & 1u) && better(v, i, bv, bi)) bv = v, bi = i;
            }
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
            }
            if (lane == 0) {
                taken[t][bi >> 5] |= 1u << (bi & 31);
                pick[t][j] = bi;
                prob[t][j] = expf(bv - mx) / sum;
            }
            __syncwarp();
        }
        if (lane == 0 && norm) {
            float s = 0.0f;
            for (int j = 0; j < k; ++j) s += prob[t][j];
            for (int j = 0; j < k; ++j) prob[t][j] /= s;
        }
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    int count = 0;
    for (int r = 0; r < t_len; ++r)
        for (int j = 0; j < k; ++j) {
            const int ex = pick[r][j], sl = r * k + j;
            int u = 0;
            while (u < count && tab->expert[u] != ex) ++u;
            if (u == count) {
                tab->expert[u] = ex;
                tab->rows[u] = 0u;
                ++count;
            }
            tab->rows[u] |= 1u << r;
            tab->slot[u][r] = sl;
            tab->topk[sl] = ex;
            tab->weight[sl] = prob[r][j];
        }
    tab->count = count;
    tab->k = k;
    if (stats) {
        atomicAdd(&stats[0], (unsigned long long)count);
        atomicAdd(&stats[1], 1ull);
    }
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
