// The MoE block of a block pass on the GPU (Qwen3-MoE routing, SDAR-30B-A3B), around the
// grouped expert products of kernels/gemv.cu:
//   1. router logits [T, E] bf16: gemv.cu's norm form (the post-attention norm folded into the
//      router's columns, as into every expert's gate|up);
//   2. unmask_moe_route (here; or in the router's own last block, gemv.cu's router form):
//      route.cuh's softmax over all experts in f32, the top k (exact ties: the lower expert id;
//      PyTorch's order on ties is its sort's, src/model/topk.rs), renormalised when the config
//      says so, and the routing table the grouped products read: the distinct experts the pass
//      touched, the rows of each, each row's slots and weights;
//   3. unmask_gemv_moe_up_u4: silu(gate) * up of every (row, choice) slot, one launch over the
//      distinct experts (grid.y = T * k slots, blocks past the count return);
//   4. unmask_gemv_moe_down_u8: each slot's down product times its weight, f32;
//   5. unmask_moe_combine (here): the k slots of a row summed in order, rounded to bf16, plus
//      the residual.
// Every shape depends only on T, E and k, and nothing comes back to the host, so the pass stays
// one CUDA graph. `stats` counts distinct experts and passes, for the floor's byte count.

#include "common.cuh"  // dependency_wait, launch_dependents, to_bf16, MoeTable
#include "route.cuh"   // route_any, store_table

__device__ __forceinline__ float bf16_to_f32(unsigned short v) { return __uint_as_float(((unsigned)v) << 16); }

// One block of 32 * t_len threads routes the pass's rows (route.cuh's route_block) into a table
// in shared memory, then writes it out.
extern "C" __global__ void __launch_bounds__(256) unmask_moe_route(const unsigned short* __restrict__ logits,
                                                                   MoeTable* __restrict__ tab,
                                                                   unsigned long long* __restrict__ stats, int t_len,
                                                                   int e, int k, int norm) {
    __shared__ MoeTable s;
    launch_dependents();
    dependency_wait();
    route_any(logits, t_len, e, k, norm, &s);
    store_table(&s, tab, stats, t_len);
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
