// What kernels/gemv.cu and kernels/moe.cu share. Both `#include "common.cuh"`; NVRTC compiles
// each file alone and, on the GPU host, has no kernels/ folder to look in (the sources are
// built into the binary), so src/model/cuda/nvrtc.rs hands this file to it as the named header
// "common.cuh" (scripts/nvrtc_check.py does the same). nvcc would find it next to them.
#ifndef UNMASK_COMMON_CUH
#define UNMASK_COMMON_CUH

// Programmatic dependent launch (src/model/cuda/launch.rs): wait until the kernel before this
// one has finished and its writes are visible; let the next kernel launch. Both compile away
// before sm_90.
__device__ __forceinline__ void dependency_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// f32 to bf16 bits, rounded to nearest even (no cuda_bf16.h: NVRTC has no system headers).
__device__ __forceinline__ unsigned short to_bf16(float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                      // round to nearest even
    return (unsigned short)(u >> 16);
}

// The routing table of one MoE layer's block pass, written by moe.cu's unmask_moe_route and
// read by gemv.cu's grouped forms (src/model/moe_grouped.rs reads it word by word). Slots are
// the pass's (row t, choice j) pairs, flat t * k + j: at most 8 rows x 8 choices.
#define MOE_SLOTS 64
struct MoeTable {
    int count;                  // distinct experts the rows routed to
    int k;                      // choices a row (num_experts_per_tok)
    int expert[MOE_SLOTS];      // [u] expert id of distinct expert u, in first-seen order
    unsigned rows[MOE_SLOTS];   // [u] bitmask of the rows that chose it
    int slot[MOE_SLOTS][8];     // [u][t] row t's flat slot t * k + j that chose expert u
    int topk[MOE_SLOTS];        // [t * k + j] the expert row t chose j-th
    float weight[MOE_SLOTS];    // [t * k + j] its routing weight (renormalised if the config says so)
};

#endif
