// What kernels/gemv.cu, moe.cuh and fused.cu share. Each `#include "common.cuh"`; NVRTC compiles
// each .cu file alone and, on the GPU host, has no kernels/ folder to look in (the sources are
// built into the binary), so src/model/cuda/nvrtc.rs hands this file to it as the named header
// "common.cuh" (scripts/nvrtc_check.py does the same). nvcc would find it next to them.
#ifndef UNMASK_COMMON_CUH
#define UNMASK_COMMON_CUH

// Programmatic dependent launch (src/model/cuda/launch.rs): wait until the kernel before this
// one has finished and its writes are visible; let the next kernel launch. Both compile away
// before sm_90. Every kernel has a block that reaches dependency_wait before it exits (every
// block does, those with nothing to do included, except the MoE down kernel's blocks past the
// pass's experts; its block 0 always waits), so a kernel's end implies the end of every kernel
// before it.
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

// A generic pointer into shared memory as the 32-bit shared-state address PTX's shared-memory
// instructions take.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes from global into shared memory with cp.async: a thread's copies are all in flight at
// once (a load into registers and a store would wait on each load in turn). sm_80 and later.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// c += A B on the tensor cores, mma.sync m16n8k16, bf16 in, f32 sums: A 16 x 16 (a0: row g,
// columns 2q, 2q + 1; a1: row g + 8; a2, a3: columns + 8), B 16 x 8 (b0: rows 2q, 2q + 1 of
// column g; b1: rows + 8), C 16 x 8 (c0, c1: row g, columns 2q, 2q + 1; c2, c3: row g + 8),
// g = lane / 4, q = lane % 4. sm_80 and later.
__device__ __forceinline__ void mma_bf16_16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The routing table of one MoE layer's block pass, built by moe.cuh's route_block and
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
