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

// L2 hints (trial, session 21; UNMASK_L2 bits, NVRTC's -D from the env var of that name):
// 1: the weight streams are L2 evict_first, so the weights prefetched into L2 (normal priority)
// survive them; 2: attention prefetches its layer's o weights; 4: the MoE gate|up kernel
// prefetches the down weights of the pass's experts; 8: the MoE down kernel prefetches the next
// layer's q|k|v weights; 16: attention prefetches the gate|up weights of the experts this layer's
// table held after the pass before (a guess: a block's rows change little from step to step).
// Each prefetch is issued when HBM would otherwise idle (a latency-bound
// kernel, or a product read from L2), so the next product reads from L2.
#ifndef UNMASK_L2
#define UNMASK_L2 15
#endif

// Asks the L2 for [p, p + bytes) (sm_90's bulk prefetch: one instruction, no registers, no
// completion to wait for); p and bytes multiples of 16.
__device__ __forceinline__ void prefetch_l2(const char* p, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

#define PREFETCH_CHUNK 16384L
// Block `worker` of `workers`' share of [base, base + bytes): 16 KiB chunks dealt to the
// workers' threads in turn.
__device__ __forceinline__ void prefetch_share(const char* base, long bytes, long worker, long workers) {
    const long chunks = (bytes + PREFETCH_CHUNK - 1) / PREFETCH_CHUNK;
    for (long c = worker + workers * threadIdx.x; c < chunks; c += workers * blockDim.x)
        prefetch_l2(base + c * PREFETCH_CHUNK, (unsigned)min(PREFETCH_CHUNK, bytes - c * PREFETCH_CHUNK));
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

// The L2 prefetch of the weights of a pass's experts (`per` bytes each, stacked by expert id
// from `base`), the first `count` of the table `tab`, dealt in 16 KiB chunks over every block of
// the grid (UNMASK_L2 bits 4 and 16).
__device__ __forceinline__ void prefetch_experts(const char* base, long per, const MoeTable* tab, int count) {
    const long per_chunks = (per + PREFETCH_CHUNK - 1) / PREFETCH_CHUNK, chunks = per_chunks * count;
    const long workers = (long)gridDim.x * gridDim.y, worker = (long)blockIdx.y * gridDim.x + blockIdx.x;
    for (long c = worker + workers * threadIdx.x; c < chunks; c += workers * blockDim.x) {
        const long at = (c % per_chunks) * PREFETCH_CHUNK;
        prefetch_l2(base + tab->expert[c / per_chunks] * per + at, (unsigned)min(PREFETCH_CHUNK, per - at));
    }
}

#endif
