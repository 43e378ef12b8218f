// What it costs a block pass to wait for the kernel before it, and what a grid-wide barrier
// costs instead: the numbers a single-kernel (persistent, dataflow) layer would be designed on
// (docs/perf.md, session 22: the 30B-A3B's gap to its floor sits in its eight dependent
// kernels a layer). Needs only nvcc:
//
//   nvcc -O3 -arch=sm_90 -o /tmp/sync_bench scripts/sync_bench.cu && /tmp/sync_bench
//
// (H100 figures: docs/gpu-runs/2026-12-06-session23-h100-sync/; a PDL boundary is the cheapest.)
//
// chain G: N kernels of G blocks x 256 threads in one CUDA graph, each block reading the word
//   the previous kernel's block 0 wrote and writing its own (a data dependency, as every
//   kernel of a layer has), under programmatic dependent launch (each kernel signals at once
//   and waits with griddepcontrol.wait) and without: microseconds a kernel.
// barrier G: one cooperative kernel of G resident blocks passing N grid barriers, each block
//   then reading the word block 0 wrote before it: microseconds a barrier. `fence`: the
//   barrier of the removed persistent trials (__threadfence, atomicAdd, spin on a generation
//   word); `relacq`: release-add and acquire-loads, no separate fences; `counters`: a word a
//   step, zeroed before the launch, that every block adds to (release) when its step is done
//   and the next step waits on until it reaches G (acquire): the wait a dataflow kernel's tile
//   makes for the tiles it reads, no reset and no generation word.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../kernels/gemv.cu"  // common.cuh (dependency_wait, launch_dependents); bench_common.cuh wants gemv

#include "bench_common.cuh"

const int N = 480;  // ten kernels a layer, 48 layers

__global__ void step_k(unsigned* words, int i) {
    launch_dependents();
    dependency_wait();
    __shared__ unsigned seen;
    if (threadIdx.x == 0) seen = ((volatile unsigned*)words)[i];
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) words[i + 1] = seen + 1;
}

struct Bar {
    unsigned count, gen;
};

template <bool RELACQ>
__device__ void barrier(Bar* b) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned g, now;
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(g) : "l"(&b->gen) : "memory");
        unsigned arrived;
        if (RELACQ) {
            asm volatile("atom.add.release.gpu.u32 %0, [%1], 1;" : "=r"(arrived) : "l"(&b->count) : "memory");
        } else {
            __threadfence();
            arrived = atomicAdd(&b->count, 1u);
        }
        if (arrived == gridDim.x - 1) {
            b->count = 0u;
            if (RELACQ) asm volatile("red.release.gpu.add.u32 [%0], 1;" ::"l"(&b->gen) : "memory");
            else {
                __threadfence();
                atomicAdd(&b->gen, 1u);
            }
        } else {
            do asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(&b->gen) : "memory");
            while (now == g);
        }
        if (!RELACQ) __threadfence();
    }
    __syncthreads();
}

template <bool RELACQ>
__global__ void barriers_k(unsigned* words, Bar* b) {
    __shared__ unsigned seen;
    for (int i = 0; i < N; ++i) {
        if (blockIdx.x == 0 && threadIdx.x == 0) words[i + 1] = words[i] + 1;
        barrier<RELACQ>(b);
        if (threadIdx.x == 0) seen = ((volatile unsigned*)words)[i + 1];
        __syncthreads();
        if (seen != (unsigned)(i + 1)) asm volatile("trap;");  // a barrier that let a block through early
    }
}

__global__ void counters_k(unsigned* words, unsigned* done) {
    __shared__ unsigned seen;
    for (int i = 0; i < N; ++i) {
        if (threadIdx.x == 0) {
            if (i > 0) {
                unsigned now;
                do asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(done + i - 1) : "memory");
                while (now < gridDim.x);
            }
            seen = ((volatile unsigned*)words)[i];
        }
        __syncthreads();
        if (seen != (unsigned)i) asm volatile("trap;");  // a wait that let a block through early
        if (blockIdx.x == 0 && threadIdx.x == 0) words[i + 1] = seen + 1;
        __syncthreads();
        if (threadIdx.x == 0) asm volatile("red.release.gpu.add.u32 [%0], 1;" ::"l"(done + i) : "memory");
    }
}

// `f` on G blocks of 256 threads, launched cooperatively: the driver refuses a grid whose blocks
// cannot all be resident at once (its waits would hang) instead of running it.
static void cooperative(const void* f, int G, cudaStream_t st, void** args) {
    cudaLaunchAttribute a;
    cudaLaunchConfig_t c = launch_config(dim3(G), dim3(256), 0, false, st, &a);
    a.id = cudaLaunchAttributeCooperative;
    a.val.cooperative = 1;
    c.numAttrs = 1;
    CK(cudaLaunchKernelExC(&c, f, args));
}

// Median microseconds of one replay of `g` over 20 (after 3 warm-ups).
static double replay_us(cudaGraphExec_t g, cudaStream_t st) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < 23; ++r) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(g, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float m;
        CK(cudaEventElapsedTime(&m, a, b));
        if (r >= 3) ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] * 1e3;
}

template <class F>
static double graph_us(cudaStream_t st, F body) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    body();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const double us = replay_us(ge, st);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return us;
}

int main() {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned* words;
    Bar* bar;
    CK(cudaMalloc(&words, (N + 1) * 4));
    CK(cudaMalloc(&bar, sizeof(Bar)));
    unsigned* done;
    CK(cudaMalloc(&done, N * 4));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("%d SMs; %d steps a graph\n", sms, N);
    const int grids[] = {1, 32, sms, 2 * sms, 4 * sms, 8 * sms};
    for (int G : grids) {
        double us[2];
        for (int pdl = 1; pdl >= 0; --pdl) {
            CK(cudaMemset(words, 0, (N + 1) * 4));
            us[pdl] = graph_us(st, [&] {
                for (int i = 0; i < N; ++i) {
                    void* args[] = {&words, &i};
                    cudaLaunchAttribute a;
                    const cudaLaunchConfig_t c = launch_config(dim3(G), dim3(256), 0, pdl, st, &a);
                    CK(cudaLaunchKernelExC(&c, (const void*)step_k, args));
                }
            });
        }
        unsigned last = 0;
        CK(cudaMemcpy(&last, words + N, 4, cudaMemcpyDeviceToHost));
        printf("CHAIN G %5d: %.3f us a kernel under PDL, %.3f without (last word %u of %d)\n", G, us[1] / N, us[0] / N,
               last, N);
    }
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void*)barriers_k<false>, 256, 0));
    for (int G : grids) {
        if (G > per_sm * sms) continue;
        double us[2];
        for (int r = 0; r < 2; ++r) {
            CK(cudaMemset(words, 0, (N + 1) * 4));
            CK(cudaMemset(bar, 0, sizeof(Bar)));
            const void* f = r ? (const void*)barriers_k<true> : (const void*)barriers_k<false>;
            us[r] = graph_us(st, [&] {
                void* args[] = {&words, &bar};
                cooperative(f, G, st, args);
            });
        }
        // the counters: zeroed by a memset node of the same graph, before the kernel
        CK(cudaMemset(words, 0, (N + 1) * 4));
        const double cu = graph_us(st, [&] {
            CK(cudaMemsetAsync(done, 0, N * 4, st));
            void* args[] = {&words, &done};
            cooperative((const void*)counters_k, G, st, args);
        });
        printf("BARRIER G %5d: %.3f us a barrier (fence), %.3f (relacq), %.3f a step (counters)\n", G, us[0] / N,
               us[1] / N, cu / N);
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
